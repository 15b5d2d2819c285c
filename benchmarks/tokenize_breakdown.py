"""Where a cold tokenizer + tokenize + pack run spends its time, against the raw ceiling.

    python benchmarks/tokenize_breakdown.py --corpus bench/instruct.jsonl \\
        --text-template $'{instruction}\\n{input}\\n{output}' --tokenizer bench/tok-instruct \\
        --splits 1x2 2x1 --engines tiktoken tokenizers --rounds 3

The corpus goes through moai's convert/filter/save first (not timed). Then, `--rounds` times, the
contenders run one after the other (interleaved, so other people's load on a shared machine falls
on all of them alike), each in a fresh process:

- ceiling: `tokenizers` `encode_batch_fast` over all texts on all cores (texts loaded before
  timing), as in `benchmarks/tokenize.py`;
- transformers: importing transformers (it imports torch) and `AutoTokenizer.from_pretrained`,
  in a fresh process: what every cold moai run pays before it can check a single id;
- moai ENGINE PxT: the tokenizer (the given folder adopted into the store), tokenize and pack
  stages with an empty cache, P processes × T threads each.

For each moai run: end to end (from starting the process to pack done) and its fixed costs:
process start (interpreter and moai's imports), adopting the tokenizer, checking the engine
(sampling the corpus, transformers' ids of the sample, the engine and the piece rule against
them), encoding (the parts), pack. Then, per process that encoded parts, its start-up (a
worker: from the pool's start to its encoder being warm) and the seconds it spent reading text,
in the encoder, turning ids into arrays, writing and waiting, each as a share of its wall time
(the encoder and arrays run in two helper threads, so those shares can pass 100%). CPU seconds
(the process and its finished workers) are printed beside wall time: on a shared machine they move
less than wall time. × ceiling is tokens/s end to end over the ceiling's tokens/s.

The bound per moai run: the CPU seconds its processes spent encoding parts plus transformers' CPU
seconds, spread perfectly over all cores with nothing else to do, give the shortest wall time any
cold run that encodes this way and loads transformers could take; the bound is the × ceiling of
that. A target above it cannot be reached by overlapping or trimming the other fixed costs.
The transformers line gives the same bound for a run that encodes at exactly the ceiling's own CPU
cost (the `tokenizers` engine runs the same library): the ceiling's CPU seconds plus the load's.
"Its CPU overlapped" is the × ceiling if all of the run's own CPU seconds ran perfectly spread
over all cores: what running the same work in another order could reach at best.
"""

from __future__ import annotations

import os
import sys

# This folder's tokenize.py shadows the standard library's `tokenize` when a script here runs.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

STARTED = time.time()  # as early as this script can tell: the parent subtracts its own start time


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_ceiling(saved: Path, tokenizer: Path, **_) -> dict:
    from tokenizers import Tokenizer

    from moai.formats.text import open_split_table

    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    texts = open_split_table(saved, "train").column(0).to_pylist()
    tok.encode_batch_fast(texts[:64])  # warm-up
    started, cpu = time.perf_counter(), _cpu()
    tokens = 0
    for i in range(0, len(texts), 10_000):
        tokens += sum(len(e) for e in tok.encode_batch_fast(texts[i : i + 10_000], add_special_tokens=True))
    return {"tokens": tokens, "seconds": time.perf_counter() - started, "cpu": _cpu() - cpu}


def run_transformers(tokenizer: Path, **_) -> dict:
    """What every cold run pays before it can check a single id: importing transformers (which
    imports torch) and loading the tokenizer as `AutoTokenizer` does."""
    started, cpu = time.perf_counter(), _cpu()
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(tokenizer))
    return {"seconds": time.perf_counter() - started, "cpu": _cpu() - cpu}


def run_moai(saved: Path, tokenizer: Path, work: Path, engine: str, procs: int, threads: int) -> dict:
    marks: dict[str, float] = {}
    t, cpu = time.perf_counter(), _cpu()
    from moai import pipeline
    from moai.config import read_env
    from moai.hardware import detect, plan
    from moai.pipeline import StageResult
    from moai.presets import tiny

    config = tiny(cache_dir=str(work / "moai-cache"))
    config = config.model_copy(
        update={
            "tokenizer": config.tokenizer.model_validate({"path": str(tokenizer)}),
            "tokenize": config.tokenize.model_copy(
                update={
                    "engine": "auto" if engine == "tiktoken" else engine,
                    "num_proc": procs,
                    "threads_per_proc": threads,
                }
            ),
        }
    )
    hw_plan = plan(detect(work, with_gpus=False), config, read_env())
    marks["imports"] = time.perf_counter() - t
    t = time.perf_counter()
    tok = pipeline.run_stage(
        config,
        "tokenizer",
        {"tokenizer-files": pipeline.ROOTS["tokenizer-files"](config)},
        plan=hw_plan,
        progress=False,
    )
    marks["adopt"] = time.perf_counter() - t
    t = time.perf_counter()
    saved_result = StageResult("save", "bench-" + saved.name, str(saved), {}, False)
    tokens = pipeline.run_stage(
        config, "tokenize", {"save": saved_result, "tokenizer": tok}, plan=hw_plan, progress=False
    )
    marks["tokenize"] = time.perf_counter() - t
    t = time.perf_counter()
    pipeline.run_stage(config, "pack", {"tokenize": tokens}, plan=hw_plan, progress=False)
    marks["pack"] = time.perf_counter() - t
    r = tokens.report
    marks["check"] = r["check_seconds"]
    marks["encode"] = r["seconds"]
    return {
        "tokens": r["splits"]["train"]["tokens"],
        "engine": r["engine"],
        "procs_x_threads": f"{r['processes']}x{r['threads_per_process']}",
        "marks": marks,
        "profile": r["profile"],
        "cpu": _cpu() - cpu,
        "done_at": time.time(),
    }


def measure(kind: str, args: argparse.Namespace, saved: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="moai-breakdown-", dir=args.work))
    out = work / "result.json"
    cmd = [sys.executable, __file__, "--_run", kind, "--_saved", str(saved), "--_out", str(out)]
    cmd += ["--tokenizer", str(args.tokenizer), "--work", str(work), "--corpus", "-"]
    started = time.time()
    code = subprocess.call(cmd)
    ended = time.time()
    if code != 0:
        raise SystemExit(f"{kind} failed with exit code {code}")
    result = json.loads(out.read_text())
    shutil.rmtree(work, ignore_errors=True)
    result["wall"] = ended - started
    if "marks" in result:
        result["marks"]["start"] = result.pop("started_at") - started  # interpreter and this script's imports
        result["end_to_end"] = result["done_at"] - started
    return result


def contenders(args: argparse.Namespace) -> list[str]:
    return ["ceiling", "transformers"] + [f"{e}-{s}" for e in args.engines for s in args.splits]


def best_x(tokens: int, cpu_seconds: float, ceiling_rate: float) -> float:
    """× ceiling if `cpu_seconds` ran perfectly spread over all cores, with nothing else to do."""
    return tokens / (cpu_seconds / (os.cpu_count() or 1)) / ceiling_rate


def bound(r: dict, load_cpu: float, ceiling_rate: float) -> tuple[float, float]:
    """(CPU s the run's processes spent encoding parts, the most × ceiling any cold run can reach
    that encodes at that cost and loads the tokenizer through transformers): both on all cores,
    perfectly overlapped, nothing else. Checking ids costs more on top, so real runs stay below."""
    encode_cpu = sum(p.get("cpu", 0.0) for p in r["profile"])
    return encode_cpu, best_x(r["tokens"], encode_cpu + load_cpu, ceiling_rate)


def report_run(kind: str, r: dict, ceiling_rate: float, load_cpu: float) -> None:
    if kind == "ceiling":
        print(f"  ceiling: {r['tokens']:,} tokens in {r['seconds']:.2f}s ({r['cpu']:.1f} CPU s)", flush=True)
        return
    if kind == "transformers":
        print(
            f"  transformers: import and load the tokenizer {r['seconds']:.2f}s ({r['cpu']:.2f} CPU s); a cold run "
            f"that encodes at the ceiling's own CPU cost and loads this: at most {r['x_same_cost']:.2f}x ceiling",
            flush=True,
        )
        return
    m = r["marks"]
    ratio = r["tokens"] / r["end_to_end"] / ceiling_rate
    start = m["start"] + m["imports"]
    other = r["end_to_end"] - start - m["adopt"] - m["check"] - m["encode"] - m["pack"]
    print(
        f"  {kind} ({r['engine']} {r['procs_x_threads']}): end to end {r['end_to_end']:.2f}s "
        f"({r['cpu']:.1f} CPU s) = {ratio:.2f}x ceiling | start {start:.2f}  adopt {m['adopt']:.2f}  "
        f"check {m['check']:.2f}  encode {m['encode']:.2f}  pack {m['pack']:.2f}  other {other:.2f}",
        flush=True,
    )
    for i, p in enumerate(r["profile"]):
        wall = max(p["wall"], 1e-9)
        shares = "  ".join(f"{k} {100 * p[k] / wall:.0f}%" for k in ("read", "encode", "arrays", "write", "wait"))
        print(
            f"    process {i}: start-up {p.get('startup', 0):.2f}s (encoder set-up {p.get('setup', 0):.2f}s), "
            f"parts {wall:.2f}s: {shares}",
            flush=True,
        )
    encode_cpu, best = bound(r, load_cpu, ceiling_rate)
    print(
        f"    bound: encoding {encode_cpu:.1f} CPU s + transformers {load_cpu:.2f} CPU s on {os.cpu_count()} cores "
        f"-> at most {best:.2f}x ceiling for any cold run that loads transformers; this run's own "
        f"{r['cpu']:.1f} CPU s perfectly overlapped -> {best_x(r['tokens'], r['cpu'], ceiling_rate):.2f}x",
        flush=True,
    )


def _span(values: list[float], digits: int = 2) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}" if round(lo, digits) == round(hi, digits) else f"{lo:.{digits}f}–{hi:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--text-template")
    parser.add_argument("--work", type=Path, default=Path("bench/work"))
    parser.add_argument("--splits", nargs="*", default=["1x2", "2x1"], help="processes x threads, e.g. 1x2 2x1")
    parser.add_argument("--engines", nargs="*", default=["tiktoken", "tokenizers"], choices=["tiktoken", "tokenizers"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write every run here")
    parser.add_argument("--_run", help=argparse.SUPPRESS)
    parser.add_argument("--_saved", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--_out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args._run:
        if args._run == "ceiling":
            result = run_ceiling(args._saved, args.tokenizer)
        elif args._run == "transformers":
            result = run_transformers(args.tokenizer)
        else:
            engine, split = args._run.split("-")
            procs, threads = (int(x) for x in split.split("x"))
            result = run_moai(args._saved, args.tokenizer, args.work, engine, procs, threads)
        args._out.write_text(json.dumps({**result, "started_at": STARTED}))
        return

    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_tokenize", Path(__file__).with_name("tokenize.py"))
    assert spec is not None and spec.loader is not None
    bench_tokenize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_tokenize)

    args.work.mkdir(parents=True, exist_ok=True)
    saved = bench_tokenize.prepare_text(args)
    mb = sum(f.stat().st_size for f in (saved / "train").glob("*.arrow")) / 1e6
    print(f"corpus {args.corpus}: saved text {mb:.1f} MB; {os.cpu_count()} cores", flush=True)
    runs: dict[str, list[dict]] = {k: [] for k in contenders(args)}
    for round_ in range(args.rounds):
        load = os.getloadavg()[0]
        print(f"round {round_ + 1} (load average {load:.2f})", flush=True)
        ceiling_rate, load_cpu = None, 0.0
        for kind in contenders(args):
            r = measure(kind, args, saved)
            if kind == "ceiling":
                ceiling_rate = r["tokens"] / r["seconds"]
            elif kind == "transformers":
                assert ceiling_rate is not None
                load_cpu = r["cpu"]
                ceiling = runs["ceiling"][-1]
                r["x_same_cost"] = best_x(ceiling["tokens"], ceiling["cpu"] + load_cpu, ceiling_rate)
            else:
                assert ceiling_rate is not None
                r["x_ceiling"] = r["tokens"] / r["end_to_end"] / ceiling_rate
                r["x_bound"] = bound(r, load_cpu, ceiling_rate)[1]
                r["x_overlapped"] = best_x(r["tokens"], r["cpu"], ceiling_rate)
            r["load"] = load
            runs[kind].append(r)
            report_run(kind, r, ceiling_rate, load_cpu)
    print(
        "\n| contender | × ceiling, end to end | its CPU overlapped | bound with transformers | end to end s | CPU s |"
    )
    print("|---|---|---|---|---|---|")
    for kind, rs in runs.items():
        if kind == "transformers":
            secs, cpus = [r["seconds"] for r in rs], [r["cpu"] for r in rs]
            same = _span([r["x_same_cost"] for r in rs]) + " at the ceiling's cost"
            print(f"| transformers (import + load) | – | – | {same} | {_span(secs)} | {_span(cpus, 2)} |")
            continue
        xs = [1.0 if kind == "ceiling" else r["x_ceiling"] for r in rs]
        bounds = "–" if kind == "ceiling" else _span([r["x_bound"] for r in rs])
        over = "–" if kind == "ceiling" else _span([r["x_overlapped"] for r in rs])
        secs = [r["seconds" if kind == "ceiling" else "end_to_end"] for r in rs]
        cpus = [r["cpu"] for r in rs]
        print(f"| {kind} | {_span(xs)} | {over} | {bounds} | {_span(secs)} | {_span(cpus, 1)} |")
    if args.json:
        args.json.write_text(json.dumps({"corpus_mb": mb, "cores": os.cpu_count(), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
