"""What the machine has (`detect`) and what moai will use of it (`plan`).

`detect` is the only code in moai that asks psutil, the OS or torch.cuda about the machine.
`plan` is pure: the same hardware and config always give the same plan, so it is tested with
tables of made-up machines. Every decision carries a one-line reason, and an explicit setting
(config first, then the DATASET_* environment variables) always wins over the heuristic.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moai.config import PipelineConfig

NETWORK_FILESYSTEMS = {
    "nfs",
    "nfs4",
    "cifs",
    "smbfs",
    "smb3",
    "lustre",
    "gpfs",
    "beegfs",
    "fuse.sshfs",
    "9p",
    "ceph",
    "glusterfs",
}


@dataclass(frozen=True)
class Hardware:
    cores: int
    mem_available_gb: float
    disk_type: str  # ssd | hdd | virtual | network | unknown
    disk_free_gb: float
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    value: Any
    reason: str


@dataclass(frozen=True)
class Plan:
    num_proc: Decision
    threads_per_proc: Decision
    batch_size: Decision
    writer_batch_size: Decision
    memory_mode: Decision
    loader_workers: Decision
    hardware: Hardware = field(repr=False)
    # (processes, threads each) when the engine is fastokens or gigatoken
    fast_engines: Decision = Decision((1, 1), "one process, one thread")
    convert_workers: Decision = Decision(1, "convert's own thread")
    # documents a call when the engine is fastokens or gigatoken (`batch_size`: the other engines)
    fast_batch_size: Decision = Decision(1000, "as batch_size")

    def rows(self) -> list[dict[str, str]]:
        """The plan as table rows (setting, value, reason), for printing and UI artifacts."""
        out = []
        for name in (
            "num_proc",
            "threads_per_proc",
            "batch_size",
            "writer_batch_size",
            "memory_mode",
            "loader_workers",
            "fast_engines",
            "fast_batch_size",
            "convert_workers",
        ):
            d: Decision = getattr(self, name)
            out.append({"setting": name, "value": str(d.value), "reason": d.reason})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": asdict(self.hardware),
            "decisions": {
                r["setting"]: {"value": getattr(self, r["setting"]).value, "reason": r["reason"]} for r in self.rows()
            },
        }


def _disk_of(path: Path) -> tuple[str, float]:
    import psutil

    path = path.resolve()
    probe = path
    while not probe.exists():
        probe = probe.parent
    free_gb = psutil.disk_usage(str(probe)).free / 1e9
    best = None
    for part in psutil.disk_partitions(all=True):
        mp = Path(part.mountpoint)
        if (probe == mp or mp in probe.parents) and (best is None or len(str(mp)) > len(best.mountpoint)):
            best = part
    if best is None:
        return "unknown", free_gb
    if best.fstype.lower() in NETWORK_FILESYSTEMS:
        return "network", free_gb
    dev = Path(best.device).name
    # /sys/block/<disk>/queue/rotational: 1 for spinning disks; partitions map to their parent disk.
    for candidate in (dev, dev.rstrip("0123456789"), dev.split("p")[0] if dev.startswith("nvme") else dev):
        block = Path("/sys/block") / candidate
        rot = block / "queue" / "rotational"
        if rot.is_file():
            driver = (block / "device" / "driver").resolve().name if (block / "device" / "driver").exists() else ""
            return disk_kind(rot.read_text().strip(), driver, candidate), free_gb
    return "unknown", free_gb


VIRTUAL_DISK_DRIVERS = {"virtio_blk", "virtio_scsi", "xen_blkfront", "vbd", "hv_storvsc"}


def disk_kind(rotational: str, driver: str, name: str) -> str:
    """ssd, hdd or virtual from /sys/block/<disk>: a paravirtual disk (virtio, Xen, Hyper-V) reports
    rotational 1 by default whatever stores it, so its flag is no evidence of a spinning disk."""
    if driver in VIRTUAL_DISK_DRIVERS or name.startswith(("vd", "xvd")):
        return "virtual"
    return "hdd" if rotational == "1" else "ssd"


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the disk that holds `path` (or its nearest existing parent)."""
    import psutil

    probe = Path(path).resolve()
    while not probe.exists():
        probe = probe.parent
    return int(psutil.disk_usage(str(probe)).free)


def _gpus() -> tuple[str, ...]:
    try:
        import torch
    except ImportError:
        return ()
    if not torch.cuda.is_available():
        return ()
    return tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))


@functools.lru_cache(maxsize=1)
def gpu_count() -> int:
    """How many CUDA GPUs this machine has (asked once a process: the mix's budget needs it)."""
    return len(_gpus())


def detect(cache_dir: str | os.PathLike = ".", with_gpus: bool = True) -> Hardware:
    """Read the machine: usable cores, available RAM, disk of `cache_dir`, GPUs."""
    import psutil

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = psutil.cpu_count(logical=True) or 1
    disk_type, free_gb = _disk_of(Path(cache_dir))
    return Hardware(
        cores=cores,
        mem_available_gb=round(psutil.virtual_memory().available / 1e9, 1),
        disk_type=disk_type,
        disk_free_gb=round(free_gb, 1),
        gpus=_gpus() if with_gpus else (),
    )


def _explicit(name: str, config_value: Any, env: dict[str, int]) -> Decision | None:
    if config_value is not None:
        return Decision(config_value, f"set in config ({name})")
    if name in env:
        var = {
            "num_proc": "DATASET_NUM_PROC",
            "batch_size": "DATASET_BATCH_SIZE",
            "writer_batch_size": "DATASET_WRITER_BATCH_SIZE",
        }[name]
        return Decision(env[name], f"set by environment variable {var}")
    return None


CONVERT_WORKERS_MIN_CORES = 4

# Processes × threads. Small machines: one process per core, one thread each. Measured on 2 cores
# (benchmarks/tokenize_breakdown.py, 64 MB of 1.6 KB instruction records, 32k BPE, cold, end to end
# as a fraction of the raw ceiling, 3 interleaved rounds): tiktoken 2×1 2.06–2.49 against 1×2
# 2.20–2.32 (2×1/1×2 per round 0.92–1.13), tokenizers 2×1 1.03–1.92 against 1×2 0.85–1.33 (1.17–1.44):
# one process's Python side (ids → lists → arrays under one GIL) holds 2 threads back, and worker
# start-up now overlaps the engine check. 3–4 cores follow the same rule, not measured.
# Bigger machines: this many Rayon threads a process. Measured before that overlap on 16 cores
# (100 MB of code/docs, 32k BPE, tokens/s as a fraction of one 16-thread encode_batch):
# tokenizers 16×1 0.33, 8×2 0.38–0.56, 4×4 0.44–0.54; tiktoken 16×1 0.35, 8×2 0.46–0.58, 4×4 0.65–0.80.
THREADS_PER_PROC_MANY_CORES = 4
SMALL_MACHINE_CORES = 4
# fastokens and gigatoken: documents a call at most, besides `parts.BATCH_MAX_BYTES` of text (~4 MB),
# which bounds it first unless the documents are under ~40 bytes. Their calls are sized by the text:
# at the plan's 1000 documents (1.6 MB of 1.6 KB records) the stage took ~1.05-1.09x the time.
FAST_BATCH_DOCUMENTS = 100_000
# Memory a tokenize worker holds beyond its batch (interpreter, tokenizer, Arrow maps).
WORKER_BASE_GB = 0.4


def data_plan(config: PipelineConfig) -> Plan:
    """The plan for data stages: this machine read now (no GPU probe), the config, DATASET_* settings."""
    from moai.config import read_env

    return plan(detect(config.cache_dir, with_gpus=False), config, read_env())


def plan(hw: Hardware, config: PipelineConfig, env: dict[str, int] | None = None) -> Plan:
    """Turn hardware + config (+ DATASET_* environment settings) into resource decisions."""
    env = env or {}
    res = config.resources
    tok = config.tokenize

    budget_gb = res.mem_budget_gb or max(0.5, hw.mem_available_gb * 0.5)

    num_proc = _explicit("num_proc", tok.num_proc or res.num_proc, env)
    if num_proc is None:
        by_mem = max(1, int(budget_gb / WORKER_BASE_GB))
        if hw.cores <= SMALL_MACHINE_CORES:
            by_cores = hw.cores
            why = (
                f"{hw.cores} cores, one process each: on 2 cores 2 processes × 1 thread measured 0.92–1.13× "
                "1 × 2 with tiktoken and 1.17–1.44× with tokenizers (benchmarks/tokenize_breakdown.py)"
            )
        else:
            by_cores = max(1, hw.cores // THREADS_PER_PROC_MANY_CORES)
            why = f"{hw.cores} cores / {THREADS_PER_PROC_MANY_CORES} threads each"
        n = min(by_cores, by_mem)
        if by_mem < by_cores:
            why += f", capped by memory budget {budget_gb:.1f} GB"
        num_proc = Decision(n, why)

    if tok.threads_per_proc is not None:
        threads = Decision(tok.threads_per_proc, "set in config (tokenize.threads_per_proc)")
    else:
        t = max(1, hw.cores // num_proc.value)
        threads = Decision(t, f"{hw.cores} cores shared by {num_proc.value} process(es)")

    fast = _fast_engine_split(hw.cores, tok.num_proc, tok.threads_per_proc)

    batch = _explicit("batch_size", tok.batch_size or res.batch_size, env)
    if batch is not None:
        fast_batch = batch
    else:
        batch = Decision(
            1000, "1000 documents per encode call (tiktoken, tokenizers): enough work for every thread, bounded memory"
        )
        fast_batch = Decision(
            FAST_BATCH_DOCUMENTS,
            f"fastokens/gigatoken: ~4 MB of text per call, up to {FAST_BATCH_DOCUMENTS:,} documents (on 2 cores, "
            "the stage took ~1.05-1.09x the time at 1000 a call: docs/performance.md)",
        )

    writer = _explicit("writer_batch_size", res.writer_batch_size, env)
    if writer is None:
        writer = Decision(10_000, "10000 rows per Arrow record batch: flat memory while converting text")

    if hw.mem_available_gb < 2:
        memory_mode = Decision(
            "lean", f"only {hw.mem_available_gb} GB available: smallest batches, one worker at a time"
        )
    else:
        memory_mode = Decision("stream", f"{hw.mem_available_gb} GB available; every stage streams in bounded batches")

    if res.loader_workers is not None:
        loader = Decision(res.loader_workers, "set in config (resources.loader_workers)")
    else:
        per_gpu = max(1, len(hw.gpus))
        lw = max(0, min(4, (hw.cores // per_gpu) - 1))
        loader = Decision(lw, f"{hw.cores} cores for {per_gpu} training process(es), one core kept for the step itself")

    if res.convert_workers is not None:
        convert = Decision(res.convert_workers, "set in config (resources.convert_workers)")
    elif hw.cores < CONVERT_WORKERS_MIN_CORES:
        convert = Decision(
            1,
            f"{hw.cores} cores: convert parses in its own thread (on 2 cores, 2 worker processes took 1.1-1.2x "
            "one thread's time on 601 MB of JSON lines: benchmarks/convert_workers.py)",
        )
    else:
        convert = Decision(
            hw.cores - 1,
            f"{hw.cores} cores: JSON-lines files of 48 MB or more parsed by one process a core, but the one "
            "where convert's thread reads, hashes and writes",
        )

    return Plan(
        num_proc,
        threads,
        batch,
        writer,
        memory_mode,
        loader,
        hardware=hw,
        fast_engines=fast,
        convert_workers=convert,
        fast_batch_size=fast_batch,
    )


# fastokens and gigatoken encode at hundreds of MB/s a core with their own thread pools: the
# Python side around them (text out of Arrow, ids to the part files) becomes the work. Measured on
# 2 cores (the tokenize stage on 565 MB of instruction records, Tekken 131k, 2 interleaved rounds
# on a loaded machine): encoding 5.2 and 6.1 s with 1 process × 2 threads against 7.7 and 9.2 s
# with 2 processes × 1 thread, whose start-up (interpreter, imports, the 131k-vocabulary encoder)
# costs more than the second Python side saves (docs/performance.md, "Fast engines"). On 16 cores
# (the lent GPU machine, 1.26 GB of the same records, benchmarks/many_cores.sh, one round each):
# the stage took 3.95 s with 1 × 16, 5.53 s with 4 × 4 and 6.21 s with 2 × 8. Past
# FAST_ENGINE_THREADS cores, one process per FAST_ENGINE_THREADS (not measured).
FAST_ENGINE_THREADS = 16


def _fast_engine_split(cores: int, procs: int | None, threads: int | None) -> Decision:
    if procs is not None or threads is not None:
        p = procs or max(1, cores // (threads or cores))
        return Decision((p, threads or max(1, cores // p)), "set in config (tokenize.num_proc / threads_per_proc)")
    if cores <= FAST_ENGINE_THREADS:
        calls = (
            "two encode calls in flight, one fastokens thread each"
            if cores <= 2
            else "two encode calls in flight on fastokens' pool of every core"
        )
        return Decision(
            (1, cores),
            f"{cores} cores: fastokens/gigatoken in one process with {cores} threads, {calls} (measured on 2 and "
            "16 cores: faster than more processes with fewer threads each, docs/performance.md)",
        )
    p = max(1, cores // FAST_ENGINE_THREADS)
    return Decision(
        (p, max(1, cores // p)),
        f"{cores} cores / {FAST_ENGINE_THREADS} threads a process (not measured past 16 cores)",
    )


def accelerator_facts() -> dict[str, Any]:
    """torch's version and, per CUDA GPU, what `moai doctor` checks (bf16, tf32, flash SDPA)."""
    try:
        import torch
    except ImportError:
        return {}
    facts: dict[str, Any] = {"version": torch.__version__, "cuda_devices": []}
    if torch.cuda.is_available():
        facts["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        major, _ = torch.cuda.get_device_capability(0)
        facts["bf16"] = torch.cuda.is_bf16_supported()
        facts["tf32"] = major >= 8
        facts["flash_sdpa"] = major >= 8 and torch.backends.cuda.flash_sdp_enabled()
    return facts
