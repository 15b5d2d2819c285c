"""`moai doctor`: is this machine set up to run moai well? Each check prints pass/warn/fail and a fix.

`gather` reads the machine (tokenizer, cores, memory, disk, environment, torch, accelerate,
Prefect API) and, given a config, runs its checks (`moai.preflight`: source, hub names,
cache_dir, space for the corpus, seq_len, validation); `evaluate` is pure and turns those facts
into checks, so every decision is tested with made-up facts. The exit status is non-zero when any check fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moai.config import ConfigError, PipelineConfig, read_env
from moai.hardware import Hardware, accelerator_facts, detect, plan
from moai.preflight import Check

__all__ = ["Check", "Facts", "evaluate", "gather"]


@dataclass
class Facts:
    hardware: Hardware
    plan_summary: str
    tokenizer: dict[str, Any] = field(default_factory=dict)  # {"kind": "given"/"train"/"none", "error", "is_fast"}
    env: dict[str, str] = field(default_factory=dict)
    env_error: str | None = None
    torch: dict[str, Any] = field(default_factory=dict)  # version, cuda_devices, bf16, tf32, flash_sdpa
    accelerate_default_config: str | None = None
    prefect_api_url: str | None = None
    prefect_reachable: bool | None = None
    prefect_error: str | None = None
    # the config's own checks (`moai.preflight`): source, hub names, cache_dir, space, seq_len, ...
    preflight: list[Check] = field(default_factory=list)
    remote_cache: str | None = None  # the config's remote_cache URL, if any
    remote_error: str | None = None  # why it cannot be read and written (None: it can)


ENV_VARS = (
    "TOKENIZERS_PARALLELISM",
    "RAYON_NUM_THREADS",
    "FASTOKENS_BPE_THREADS",
    "OMP_NUM_THREADS",
    "DATASET_NUM_PROC",
    "DATASET_BATCH_SIZE",
    "DATASET_WRITER_BATCH_SIZE",
)


def evaluate(f: Facts) -> list[Check]:
    """The checks for a set of facts (pure)."""
    hw = f.hardware
    out: list[Check] = []

    tok = f.tokenizer
    if tok.get("kind") == "train":
        out.append(Check("tokenizer", "pass", "trained by moai from your text (a fast byte-level BPE)"))
    elif tok.get("kind") == "given":
        if tok.get("error"):
            out.append(Check("tokenizer", "fail", tok["error"], "point tokenizer.path at a folder with tokenizer.json"))
        elif tok.get("is_fast"):
            out.append(
                Check(
                    "tokenizer", "pass", f"{tok.get('path')} is fast (Rust tokenizers), vocab {tok.get('vocab_size')}"
                )
            )
        else:
            out.append(
                Check(
                    "tokenizer",
                    "fail",
                    f"{tok.get('path')} is a slow tokenizer",
                    "save a fast one: AutoTokenizer.from_pretrained(path).save_pretrained(path)",
                )
            )
    else:
        out.append(Check("tokenizer", "warn", "no config given: tokenizer not checked", "run `moai doctor CONFIG`"))

    mem_status = "pass" if hw.mem_available_gb >= 4 else "warn"
    out.append(
        Check(
            "cores and memory",
            mem_status,
            f"{hw.cores} cores, {hw.mem_available_gb} GB available; plan: {f.plan_summary}",
            ""
            if mem_status == "pass"
            else "free memory or set resources.mem_budget_gb; stages stream, but workers need room",
        )
    )

    disk_fix = {
        "hdd": "put cache_dir on an SSD: memory-mapped reads are random access",
        "network": (
            "put cache_dir on a local disk: file locks and memory maps over network filesystems are slow or unsafe"
        ),
        "unknown": "check that cache_dir is on a local SSD",
    }
    out.append(
        Check(
            "disk",
            "pass" if hw.disk_type in ("ssd", "virtual") else "warn",
            f"cache_dir on {hw.disk_type}"
            + (" disk (its kind cannot be told from inside the machine)" if hw.disk_type == "virtual" else ""),
            disk_fix.get(hw.disk_type, ""),
        )
    )
    if hw.disk_free_gb < 1:
        out.append(Check("free space", "fail", f"{hw.disk_free_gb} GB free", "free disk space or move cache_dir"))
    elif hw.disk_free_gb < 20:
        out.append(
            Check(
                "free space",
                "warn",
                f"{hw.disk_free_gb} GB free: a corpus needs ~3× its size",
                "free disk space or move cache_dir",
            )
        )
    else:
        out.append(Check("free space", "pass", f"{hw.disk_free_gb} GB free"))

    out.extend(f.preflight)
    out.extend(_env_checks(f.env, f.env_error, hw.cores))
    out.extend(_torch_checks(f.torch))

    if f.accelerate_default_config:
        out.append(
            Check(
                "accelerate config",
                "warn",
                f"{f.accelerate_default_config} exists",
                "moai always passes its own config file, so this default is ignored by moai runs; "
                "remove it if other launches should not pick it up",
            )
        )
    else:
        out.append(Check("accelerate config", "pass", "no default config: moai's explicit settings apply"))

    if not f.prefect_api_url:
        out.append(
            Check(
                "prefect api",
                "warn",
                "PREFECT_API_URL not set: each flow run starts a temporary server (~10 s)",
                "prefect server start --host 127.0.0.1 and export PREFECT_API_URL=http://127.0.0.1:4200/api",
            )
        )
    elif f.prefect_reachable:
        out.append(Check("prefect api", "pass", f"{f.prefect_api_url} answers"))
    else:
        out.append(
            Check(
                "prefect api",
                "fail",
                f"{f.prefect_api_url} unreachable: {f.prefect_error}",
                "start the server, or unset PREFECT_API_URL to use a temporary one",
            )
        )
    if f.remote_cache and f.remote_error:
        out.append(Check("remote cache", "fail", f.remote_error, "fix remote_cache, its bucket or the credentials"))
    elif f.remote_cache:
        out.append(Check("remote cache", "pass", f"{f.remote_cache}: reachable, bucket there, writable"))
    return out


def _env_checks(env: dict[str, str], env_error: str | None, cores: int) -> list[Check]:
    out = []
    if env.get("TOKENIZERS_PARALLELISM", "").lower() in ("false", "0"):
        out.append(
            Check(
                "TOKENIZERS_PARALLELISM",
                "warn",
                "false: each tokenize process encodes on one thread",
                "unset it; moai sets threads per process itself",
            )
        )
    # thread pools a variable caps below the machine's cores (fastokens: moai sets 1 up to 2 cores)
    for name, what, above, fix in (
        ("RAYON_NUM_THREADS", "tokenizing", 0, ""),
        ("FASTOKENS_BPE_THREADS", "fastokens", 2, " (moai sizes fastokens' pool itself)"),
    ):
        value = env.get(name)
        if value and value.isdigit() and cores > above and int(value) < cores:
            out.append(
                Check(
                    name,
                    "warn",
                    f"{value} of {cores} cores for {what} in one process",
                    f"unset it unless you share the machine{fix}",
                )
            )
    if env.get("OMP_NUM_THREADS") == "1":
        out.append(
            Check("OMP_NUM_THREADS", "warn", "1: CPU training uses one core per process", "unset it for CPU runs")
        )
    if env_error:
        out.append(Check("DATASET_* variables", "fail", env_error, "set a positive integer or unset it"))
    else:
        set_vars = {k: v for k, v in env.items() if k.startswith("DATASET_")}
        detail = f"override the plan: {set_vars}" if set_vars else "not set: the hardware plan decides"
        out.append(Check("DATASET_* variables", "pass", detail))
    return out


def _torch_checks(t: dict[str, Any]) -> list[Check]:
    if not t.get("version"):
        return [Check("torch", "fail", "torch is not installed", "bash scripts/setup.sh")]
    out = [Check("torch", "pass", f"torch {t['version']}")]
    devices = t.get("cuda_devices") or []
    if not devices:
        out.append(
            Check(
                "gpu",
                "warn",
                "no CUDA GPU: training runs on CPU (fine for the tiny preset)",
                "on a GPU machine, install a CUDA build of torch",
            )
        )
        return out
    out.append(Check("gpu", "pass", f"{len(devices)} × {devices[0]}"))
    out.append(
        Check(
            "bf16",
            "pass" if t.get("bf16") else "warn",
            "supported" if t.get("bf16") else "not supported",
            "" if t.get("bf16") else "use train.mixed_precision: fp16",
        )
    )
    out.append(Check("tf32", "pass" if t.get("tf32") else "warn", "available" if t.get("tf32") else "not on this GPU"))
    out.append(
        Check(
            "flash sdpa",
            "pass" if t.get("flash_sdpa") else "warn",
            "flash attention kernel available" if t.get("flash_sdpa") else "no flash kernel for SDPA",
            "" if t.get("flash_sdpa") else "an Ampere or newer GPU enables it",
        )
    )
    return out


def gather(config: PipelineConfig | None) -> Facts:
    """Read the facts of this machine (side effects live here)."""
    from moai.stages.tokenizer import load_tokenizer

    cache_dir = config.cache_dir if config else "."
    hw = detect(cache_dir)
    env_error = None
    try:
        env_settings = read_env()
    except ConfigError as err:
        env_settings, env_error = {}, str(err)
    summary = "-"
    if config is not None:
        p = plan(hw, config, env_settings)
        summary = f"{p.num_proc.value} process(es) × {p.threads_per_proc.value} threads, batch {p.batch_size.value}"
    from moai import preflight

    # tokenizer.path is checked below by loading it (which resolves it first, in seconds)
    checks = preflight.run(config, tokenizer=False) if config is not None else []
    tok: dict[str, Any] = {"kind": "none"}
    if config is not None and config.tokenizer.train is not None:
        tok = {"kind": "train"}
    elif config is not None and config.tokenizer.path is not None:  # TokenizerConfig: one of train, path
        tok = {"kind": "given", "path": config.tokenizer.path}
        try:
            t = load_tokenizer(config.tokenizer.path, config.tokenizer.trust_remote_code)
            tok.update(is_fast=bool(getattr(t, "is_fast", False)), vocab_size=len(t))
        except ValueError as err:
            tok["error"] = str(err)
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    default_acc = hf_home / "accelerate" / "default_config.yaml"
    api = os.environ.get("PREFECT_API_URL")
    reachable, error = None, None
    if api:
        import httpx

        try:
            reachable = httpx.get(api.rstrip("/") + "/health", timeout=5).status_code == 200
        except httpx.HTTPError as err:
            reachable, error = False, f"{type(err).__name__}: {err}"
    remote_error = None
    if config is not None and config.remote_cache is not None:
        from moai.errors import MoaiError
        from moai.remote_cache import RemoteCache

        try:
            RemoteCache(config.remote_cache, config.remote_cache_options).check(write=True)
        except MoaiError as err:
            remote_error = str(err)
    return Facts(
        hardware=hw,
        plan_summary=summary,
        tokenizer=tok,
        env={k: os.environ[k] for k in ENV_VARS if k in os.environ},
        env_error=env_error,
        torch=accelerator_facts(),
        accelerate_default_config=str(default_acc) if default_acc.is_file() else None,
        prefect_api_url=api,
        prefect_reachable=reachable,
        prefect_error=error,
        preflight=checks,
        remote_cache=config.remote_cache if config is not None else None,
        remote_error=remote_error,
    )
