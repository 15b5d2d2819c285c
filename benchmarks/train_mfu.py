"""Tokens/s, MFU and host-side overhead of the moai training loop, on synthetic packed data.

Runs `moai.train.loop.train` itself (the code `moai train` launches: Accelerate, bf16 autocast,
torch.compile, flex_attention with document masking, fused AdamW, the real DataLoader with its
workers and pinned memory, the log lines) on a synthetic sample index, with four things swapped
out: the tokenizer (a vocabulary size), `open_data` (the synthetic samples), and the checkpoint
and final-model writes (no-ops). Each run is one process; several runs (`--run`) go back to back
and end in one table.

Synthetic data: documents whose token lengths follow those of docs/performance.md's benchmark corpus
(`make_corpus.py` text with its 32k tokenizer: median ~1,500 tokens, 85% of tokens in documents
longer than 2,048), concatenated and cut into seq_len rows with `position_ids` restarting at each
document (moai's own `position_ids`), so flex_attention masks documents as on real data. Tokens
have a learnable structure (Zipf unigrams; every second token a fixed function of the one before),
so the loss falls and runs can be compared step by step.

Per run: steps 1..warmup (compile), then `steps` timed steps between two synchronisations (tokens/s,
MFU by the PaLM formula against the GPU's dense bf16 peak, as the log lines compute it), then
`profile_steps` steps under the PyTorch profiler: the share of that window in which the GPU runs
nothing (no kernel, no copy) is the host-side overhead share; the CPU time of the data loading
(`next()` on the loader), of the logging (`log_step`, which waits for the GPU) and of the rest of
the step (launching the work) is reported beside it. Also: the first steps' losses, peak memory.

    python benchmarks/train_mfu.py                                   # the 1.1B Llama, this tree
    python benchmarks/train_mfu.py --run base=.trees/base --run now=. --run ga4=.,ga=4
    python benchmarks/train_mfu.py --tiny --steps 4 --warmup 2       # CPU smoke test

A run is NAME=TREE[,mb=N][,ga=N]: TREE is a folder holding the `moai` package to run (a copy of
another commit's, to compare), mb the micro batch, ga the gradient accumulation steps.
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` when a script of this folder runs.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import subprocess
import tempfile
import time
import types
from pathlib import Path

import numpy as np

# Token lengths of the documents of bench/corpus.jsonl (make_corpus.py --mb 50) under its 32k
# tokenizer: the 0th, 2nd, ..., 100th percentiles (3,758 documents).
DOC_LENGTH_PERCENTILES = [
    15, 31, 54, 97, 141, 182, 229, 274, 320, 366, 424, 477, 524, 584, 649, 714, 777, 835, 907, 978,
    1054, 1134, 1211, 1292, 1389, 1487, 1580, 1665, 1785, 1906, 2034, 2168, 2326, 2533, 2691, 2932,
    3071, 3288, 3525, 3901, 4267, 4696, 5138, 5763, 6410, 7388, 8787, 10625, 13262, 17988, 156072,
]  # fmt: skip

LLAMA_1B = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}
TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


class SyntheticSamples:
    """What `PackedDataset` reads from a sample index: len(), [i] -> input_ids and position_ids."""

    order = "shuffle"
    source_names = ("synthetic",)

    def __init__(self, num_samples: int, seq_len: int, vocab: int, seed: int):
        from moai.formats.tokens import position_ids  # noqa: F401 (fail here, not in a worker)

        rng = np.random.default_rng(seed)
        self.seq_len, total = seq_len, num_samples * seq_len
        u = rng.random(total // 15 + 16)
        lengths = np.interp(u * 100, np.arange(0, 101, 2), DOC_LENGTH_PERCENTILES).astype(np.int64)
        lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), total)) + 1]
        self.doc_offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        p = 1.0 / np.arange(1, vocab + 1) ** 1.1
        tokens = rng.choice(vocab, size=total, p=p / p.sum()).astype(np.int32)
        tokens[1::2] = rng.permutation(vocab)[tokens[0::2]]
        self.tokens = tokens
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        from moai.formats.tokens import position_ids

        s = i * self.seq_len
        ids = self.tokens[s : s + self.seq_len].astype(np.int64)
        return {"input_ids": ids, "position_ids": position_ids(s, self.seq_len, self.doc_offsets)}


def synthetic_dataset(num_samples: int, seq_len: int, vocab: int, seed: int):
    from moai.train.data import PackedDataset

    data = PackedDataset.__new__(PackedDataset)  # a real PackedDataset over synthetic samples
    data.samples = SyntheticSamples(num_samples, seq_len, vocab, seed)
    data.seq_len, data.order, data.source_names = seq_len, "shuffle", ["synthetic"]
    return data


class SyntheticTokenizer:
    pad_token_id = None
    eos_token_id = 0
    bos_token_id = 1

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def gpu_idle(prof) -> tuple[float, float]:
    """(window, idle) in seconds over the profiled GPU activity: from its first start to its last
    end, and the part of that in which no kernel, copy or memset ran."""
    from torch.autograd import DeviceType

    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start
    )
    if not spans:
        return 0.0, 0.0
    busy, (cur_s, cur_e) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    window = spans[-1][1] - spans[0][0]
    return window / 1e6, (window - busy) / 1e6


def run_one(spec: dict) -> dict:
    """Train `spec`'s run in this process; return its measurements."""
    import torch
    import transformers
    from torch._dynamo.utils import counters

    from moai.config import parse_config
    from moai.train import loop
    from moai.train.resolved import DataPaths, ResolvedRun

    cuda = torch.cuda.is_available()
    warmup, steps, prof_steps, log_every = spec["warmup"], spec["steps"], spec["profile_steps"], spec["log_every"]
    total = warmup + steps + prof_steps
    mb, ga, seq_len, vocab = spec["mb"], spec["ga"], spec["seq_len"], spec["vocab"]
    out = Path(spec["out"])
    model = TINY if spec["tiny"] else LLAMA_1B
    train = {
        "model_config": model,
        "output_dir": str(out),
        "max_steps": 10**6,
        "stop_after_steps": total,
        "micro_batch_size": mb,
        "grad_accum_steps": ga,
        "log_every": log_every,
        "save_every": 10**6,
        "eval_every": 0,
        "compile": spec["compile"],
        "tracker": "none",
        "warmup_steps": 10,
        "lr": 3e-4,
    }
    config = parse_config(
        {
            "source": {"path": "synthetic.jsonl"},
            "tokenizer": {"path": "synthetic"},
            "pack": {"seq_len": seq_len},
            "train": train,
        }
    )
    job = ResolvedRun(
        config=config,
        data=DataPaths(token_store="synthetic", sample_index="synthetic", tokenizer="synthetic"),
        loader_workers=spec["workers"],
    )
    samples = max(64, total * mb * ga)
    train_data = synthetic_dataset(samples, seq_len, vocab, seed=1)
    val_data = synthetic_dataset(8, seq_len, vocab, seed=2)

    # what is swapped out: the tokenizer, the data, the checkpoint writes
    transformers.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda *a, **k: SyntheticTokenizer(vocab))  # type: ignore[attr-defined]
    loop.open_data = lambda data, split, seq_len, pad_id: train_data if split == "train" else val_data  # type: ignore[assignment]
    loop.save_checkpoint = lambda *a, **k: None  # type: ignore[assignment]
    loop.save_final = lambda *a, **k: out  # type: ignore[assignment]

    # what is measured: wrappers around the loop's own functions
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    m: dict = {"step": 0, "data_s": 0.0, "log_s": 0.0, "step_cpu_s": 0.0, "losses": [], "lines": [], "step1_s": None}
    timed = lambda: warmup < m["step"] <= warmup + steps  # noqa: E731 (inside the timed window)

    real_make_loader, real_step, real_log, real_fpt = (
        loop.make_loader,
        loop.optimizer_step,
        loop.log_step,
        loop.flops_per_token,
    )
    real_opt = loop.build_optimizer

    class TimedLoader:
        def __init__(self, loader):
            self.loader = loader

        def __iter__(self):
            it = iter(self.loader)
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                if timed():
                    m["data_s"] += time.perf_counter() - t0
                yield batch

    def make_loader(*a, **k):
        return TimedLoader(real_make_loader(*a, **k))

    def flops_per_token(*a, **k):
        m["fpt"] = real_fpt(*a, **k)
        return m["fpt"]

    def build_optimizer(model, t):
        m["model"] = model
        return real_opt(model, t)

    prof = None

    def optimizer_step(run, batches, window):
        nonlocal prof
        m["step"] += 1
        step = m["step"]
        if step == warmup + 1:
            sync()
            m["t0"] = time.perf_counter()
        if step == warmup + steps + 1 and prof_steps and cuda:
            sync()
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.start()
        t0 = time.perf_counter()
        loss, grad_norm = real_step(run, batches, window)
        if step == 1:
            sync()
            m["step1_s"] = time.perf_counter() - t0
        if timed():
            m["step_cpu_s"] += time.perf_counter() - t0
        if step <= warmup + steps:
            m["losses"].append(loss.detach().clone())
        if step == warmup + steps:
            sync()
            m["t1"] = time.perf_counter()
        return loss, grad_norm

    def log_step(run, window, loss_sum, grad_norm, lr):
        t0 = time.perf_counter()
        line = real_log(run, window, loss_sum, grad_norm, lr)
        if timed():
            m["log_s"] += time.perf_counter() - t0
            m["lines"].append(line)
        return line

    loop.make_loader, loop.optimizer_step, loop.log_step, loop.flops_per_token, loop.build_optimizer = (  # type: ignore[assignment]
        make_loader,
        optimizer_step,
        log_step,
        flops_per_token,
        build_optimizer,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    loop.train(job)
    sync()

    wall = m["t1"] - m["t0"]
    tokens = steps * mb * ga * seq_len
    tps = tokens / wall
    peak = loop.peak_flops(torch.cuda.get_device_name() if cuda else None)
    result = {
        "name": spec["name"],
        "tree": spec["tree"],
        "mb": mb,
        "ga": ga,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "step_ms": round(wall / steps * 1e3, 2),
        "tokens_per_s": round(tps, 1),
        "mfu": round(m["fpt"] * tps / peak, 4) if peak else None,
        "logged_mfu": [ln.get("mfu") for ln in m["lines"]],
        "logged_tokens_per_s": [ln.get("tokens_per_s") for ln in m["lines"]],
        "data_ms_per_step": round(m["data_s"] / steps * 1e3, 3),
        "log_ms_per_step": round(m["log_s"] / steps * 1e3, 3),
        "step_cpu_ms_per_step": round((m["step_cpu_s"] - m["data_s"]) / steps * 1e3, 3),
        "first_step_s": round(m["step1_s"], 1) if m["step1_s"] else None,
        "losses": [round(x, 5) for x in torch.stack(m["losses"]).float().tolist()],
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "flops_per_token": m["fpt"],
        "moai": os.path.dirname(os.path.dirname(loop.__file__)),
        "lm_head": type(m["model"].get_output_embeddings()).__name__,
        "graph_breaks": dict(list(counters["graph_break"].items())[:5]),
    }
    if prof is not None:
        prof.stop()
        window, idle = gpu_idle(prof)
        result["profile_steps"] = prof_steps
        result["gpu_window_ms_per_step"] = round(window / prof_steps * 1e3, 2)
        result["gpu_idle_ms_per_step"] = round(idle / prof_steps * 1e3, 2)
        result["host_overhead_share"] = round(idle / window, 4) if window else None
        if spec.get("kernels_out"):
            table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=90)
            with open(spec["kernels_out"], "a") as f:
                f.write(f"=== {spec['name']} ({prof_steps} steps)\n{table}\n")
    return result


def parse_run(text: str, defaults: dict) -> dict:
    name, _, rest = text.partition("=")
    tree, *opts = rest.split(",") if rest else ["."]
    spec = dict(defaults, name=name, tree=tree or ".")
    for opt in opts:
        key, _, value = opt.partition("=")
        if key not in ("mb", "ga"):
            raise SystemExit(f"--run {text}: unknown option {key!r} (mb, ga)")
        spec[key] = int(value)
    return spec


def table(results: list[dict]) -> str:
    rows = [
        "| run | mb x ga | tokens/s | MFU | step ms | GPU idle (host overhead) "
        "| data ms/step | log ms/step | launch ms/step | peak GiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['name']} | {r.get('mb')} x {r.get('ga')} | {r['error']} |")
            continue
        share = r.get("host_overhead_share")
        idle = f"{share:.2%} ({r['gpu_idle_ms_per_step']} ms)" if share is not None else "-"
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        rows.append(
            f"| {r['name']} | {r['mb']} x {r['ga']} | {r['tokens_per_s']:,.0f} | {mfu} | {r['step_ms']} | {idle} "
            f"| {r['data_ms_per_step']} | {r['log_ms_per_step']} | {r['step_cpu_ms_per_step']} | {r['peak_mem_gib']} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", default=[], help="NAME=TREE[,mb=N][,ga=N] (repeatable)")
    ap.add_argument("--mb", type=int, default=16, help="micro batch of runs that name none")
    ap.add_argument("--ga", type=int, default=1, help="gradient accumulation steps of runs that name none")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=10, help="steps before timing (the first compiles)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--profile-steps", type=int, default=10, help="steps under the profiler (GPU idle share)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model, seq_len 128, no compile (CPU smoke test)")
    ap.add_argument("--out", default=None, help="folder for results.jsonl, run.log, kernels.txt")
    ap.add_argument("--budget", type=float, default=None, help="seconds: start no run after this")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.one:  # a child: one run, in this process
        spec = json.loads(args.one)
        try:
            result = run_one(spec)
        except Exception as err:  # reported in the table: an OOM, say
            import traceback

            traceback.print_exc()
            result = {
                "name": spec["name"],
                "mb": spec["mb"],
                "ga": spec["ga"],
                "error": f"{type(err).__name__}: {str(err)[:120]}",
            }
        Path(spec["result"]).write_text(json.dumps(result))
        return

    start = time.perf_counter()
    out = Path(args.out or tempfile.mkdtemp(prefix="train_mfu-"))
    out.mkdir(parents=True, exist_ok=True)
    defaults = {
        "mb": 2 if args.tiny else args.mb,
        "ga": args.ga,
        "seq_len": 128 if args.tiny else args.seq_len,
        "vocab": 32000,
        "warmup": args.warmup,
        "steps": args.steps,
        "profile_steps": args.profile_steps,
        "log_every": args.log_every,
        "workers": args.workers,
        "compile": not (args.no_compile or args.tiny),
        "tiny": args.tiny,
        "kernels_out": str(out / "kernels.txt"),
    }
    specs = [parse_run(r, defaults) for r in args.run] or [parse_run("this=.", defaults)]
    results = []
    for spec in specs:
        if args.budget and time.perf_counter() - start > args.budget:
            results.append(
                {"name": spec["name"], "mb": spec["mb"], "ga": spec["ga"], "error": "skipped: --budget spent"}
            )
            continue
        spec["out"] = tempfile.mkdtemp(prefix=f"run-{spec['name']}-")
        spec["result"] = str(Path(spec["out"]) / "result.json")
        tree = str(Path(spec["tree"]).resolve())
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        t0 = time.perf_counter()
        with open(out / "run.log", "a") as log:
            log.write(f"\n===== {spec['name']} ({tree})\n")
            log.flush()
            proc = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--one", json.dumps(spec)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tree,
            )
        try:
            result = json.loads(Path(spec["result"]).read_text())
        except (OSError, ValueError):
            result = {
                "name": spec["name"],
                "mb": spec["mb"],
                "ga": spec["ga"],
                "error": f"exit {proc.returncode}, no result",
            }
        result["run_s"] = round(time.perf_counter() - t0, 1)
        results.append(result)
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(result) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k not in ("logged_tokens_per_s",)}), flush=True)
    base = next((r for r in results if "losses" in r), None)
    if base:
        for r in results:
            if "losses" in r and r is not base and r["ga"] == base["ga"] and r["mb"] == base["mb"]:
                n = min(len(r["losses"]), len(base["losses"]), 10)
                diff = max(abs(a - b) for a, b in zip(r["losses"][:n], base["losses"][:n], strict=True))
                print(f"{r['name']}: first {n} losses differ from {base['name']}'s by at most {diff:.5f}")
        print(f"{base['name']} first losses: {base['losses'][:10]}")
    print(table(results))


if __name__ == "__main__":
    main()
