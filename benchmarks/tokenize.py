"""Tokenize-and-pack throughput: the raw ceiling, the old way, and moai, in one run.

    python benchmarks/tokenize.py --corpus bench/corpus.jsonl --tokenizer bench/tok [--text-template ...]

First the corpus goes through moai's convert/filter/save (not timed), so every contender starts
from the same saved Arrow text. Then each contender runs in a fresh subprocess, on the same
train split, while this process samples the RSS of the subprocess and all its children (their
sum) every 20 ms:

- ceiling: `tokenizers` `encode_batch_fast` over all texts on all cores, nothing else
  (texts loaded into memory before timing);
- old way: `datasets.map` with a `transformers` fast tokenizer (num_proc = cores,
  batch_size=10000, writer_batch_size=50000, padding=False), then the usual `group_texts`
  packing into seq_len blocks;
- moai (tokenizers) and moai (auto → tiktoken where exact): the tokenize + pack stages, cold
  cache, processes × threads from the hardware plan.

tokens/s counts each contender's own tokens (moai and the ceiling differ by one EOS a document).
"""

from __future__ import annotations

import os
import sys

# This file's name shadows the standard library's `tokenize` (which pandas and linecache import)
# when it runs as a script, because Python puts the script's folder first on sys.path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CONTENDERS = ["ceiling", "old-way", "moai-tokenizers", "moai-auto"]


def _train_texts(saved: Path) -> list[str]:
    from moai.formats.text import open_split_table

    return open_split_table(saved, "train").column(0).to_pylist()


def run_ceiling(saved: Path, tokenizer: Path, **_) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    texts = _train_texts(saved)
    tok.encode_batch_fast(texts[:64])  # warm-up
    started = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 10_000):
        tokens += sum(len(e) for e in tok.encode_batch_fast(texts[i : i + 10_000], add_special_tokens=True))
    return {"tokens": tokens, "seconds": time.perf_counter() - started, "documents": len(texts)}


def old_way(ds, tokenizer: Path, seq_len: int, num_proc: int | None) -> dict:
    """The seeds' way over a `datasets.Dataset` with a "text" column: `.map` with a transformers
    tokenizer, then the Hugging Face guide's `group_texts` packing (the tokenizer's load not timed)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer))

    def tokenize(batch):
        return tok(batch["text"], padding=False)

    def group_texts(examples):
        # the Hugging Face guide's group_texts as written there: the contender as people run it
        concatenated = {k: sum(examples[k], []) for k in examples.keys()}  # noqa: RUF017, SIM118
        total = (len(concatenated["input_ids"]) // seq_len) * seq_len
        return {k: [t[i : i + seq_len] for i in range(0, total, seq_len)] for k, t in concatenated.items()}

    started = time.perf_counter()
    tokenized = ds.map(
        tokenize, batched=True, batch_size=10_000, writer_batch_size=50_000, num_proc=num_proc, remove_columns=["text"]
    )
    map_seconds = time.perf_counter() - started
    packed = tokenized.map(group_texts, batched=True, batch_size=1000, writer_batch_size=50_000, num_proc=num_proc)
    seconds = time.perf_counter() - started
    # Counting tokens is not part of the old way's time.
    import pyarrow.compute as pc

    tokens = int(pc.sum(pc.list_value_length(tokenized.data.table.column("input_ids"))).as_py())
    return {
        "tokens": tokens,
        "seconds": seconds,
        "map_seconds": map_seconds,
        "documents": ds.num_rows,
        "samples": packed.num_rows,
    }


def run_old_way(saved: Path, tokenizer: Path, seq_len: int, work: Path, **_) -> dict:
    import datasets

    # A private copy, so that map's cache files land in the benchmark's folder, not in moai's store.
    copy = work / "old-way-text"
    shutil.copytree(saved / "train", copy)
    return old_way(datasets.load_from_disk(str(copy)), tokenizer, seq_len, os.cpu_count())


def run_moai(saved: Path, tokenizer: Path, seq_len: int, work: Path, engine: str, **_) -> dict:
    from moai import pipeline
    from moai.config import read_env
    from moai.hardware import detect, plan
    from moai.pipeline import StageResult
    from moai.presets import tiny

    config = tiny(cache_dir=str(work / "moai-cache"))
    config = config.model_copy(
        update={
            "tokenizer": config.tokenizer.model_validate({"path": str(tokenizer)}),
            "tokenize": config.tokenize.model_copy(update={"engine": engine}),
            "pack": config.pack.model_copy(update={"seq_len": seq_len}),
        }
    )
    hw_plan = plan(detect(work, with_gpus=False), config, read_env())
    saved_result = StageResult("save", "bench-" + saved.name, str(saved), {}, False)
    tok = pipeline.run_stage(
        config,
        "tokenizer",
        {"tokenizer-files": pipeline.ROOTS["tokenizer-files"](config)},
        plan=hw_plan,
        progress=False,
    )  # loading (transformers import) is not timed, as for the ceiling
    started = time.perf_counter()
    tokens = pipeline.run_stage(
        config, "tokenize", {"save": saved_result, "tokenizer": tok}, plan=hw_plan, progress=False
    )
    packed = pipeline.run_stage(config, "pack", {"tokenize": tokens}, plan=hw_plan, progress=False)
    seconds = time.perf_counter() - started
    train = tokens.report["splits"]["train"]
    return {
        "tokens": train["tokens"],
        "seconds": seconds,
        "documents": train["documents"],
        "samples": packed.report["samples"]["train"],
        "engine": tokens.report["engine"],
        "procs_x_threads": f"{tokens.report['processes']}x{tokens.report['threads_per_process']}",
        "stage_seconds": tokens.report["seconds"],
    }


def tree_rss_peak(proc: subprocess.Popen, interval: float) -> int:
    """Wait for `proc`; the peak of the sum of its process tree's RSS (bytes), sampled so."""
    import psutil

    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            tree = [ps, *ps.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(interval)
    return peak


def measure(kind: str, args: argparse.Namespace, saved: Path) -> dict:
    """Run one contender in a fresh process; sample the peak RSS of its whole process tree."""

    work = Path(tempfile.mkdtemp(prefix=f"moai-bench-{kind}-", dir=args.work))
    out = work / "result.json"
    cmd = [
        sys.executable,
        __file__,
        "--_run",
        kind,
        "--_saved",
        str(saved),
        "--_out",
        str(out),
        "--tokenizer",
        str(args.tokenizer),
        "--seq-len",
        str(args.seq_len),
        "--work",
        str(work),
        "--corpus",
        "-",
    ]
    proc = subprocess.Popen(cmd)
    peak = tree_rss_peak(proc, 0.02)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} failed with exit code {proc.returncode}")
    result = json.loads(out.read_text())
    result["peak_rss_mb"] = round(peak / 2**20)
    shutil.rmtree(work, ignore_errors=True)
    return result


def prepare_text(args: argparse.Namespace) -> Path:
    """convert → filter → save with moai; returns the saved DatasetDict folder."""
    from moai import pipeline
    from moai.presets import tiny

    config = tiny(cache_dir=str(args.work / "text-cache"))
    source = {"path": str(args.corpus)}
    source.update({"text_template": args.text_template} if args.text_template else {"text_field": args.text_field})
    config = config.model_copy(
        update={
            "source": config.source.model_validate(source),
            "split": config.split.model_copy(update={"val_fraction": 0.0}),
        }
    )
    return Path(pipeline.walk(config, until="save")["save"].path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--text-template")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--work", type=Path, default=Path("bench/work"))
    parser.add_argument("--only", nargs="*", choices=CONTENDERS, default=CONTENDERS)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--_run", help=argparse.SUPPRESS)
    parser.add_argument("--_saved", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--_out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args._run:
        runners = {
            "ceiling": run_ceiling,
            "old-way": run_old_way,
            "moai-tokenizers": lambda **kw: run_moai(engine="tokenizers", **kw),
            "moai-auto": lambda **kw: run_moai(engine="auto", **kw),
        }
        result = runners[args._run](saved=args._saved, tokenizer=args.tokenizer, seq_len=args.seq_len, work=args.work)
        args._out.write_text(json.dumps(result))
        return

    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    saved = prepare_text(args)
    mb = sum(f.stat().st_size for f in (saved / "train").glob("*.arrow")) / 1e6
    print(
        f"corpus {args.corpus}: saved text {mb:.1f} MB in {time.perf_counter() - started:.1f}s; "
        f"{os.cpu_count()} cores; seq_len {args.seq_len}",
        flush=True,
    )
    results = {kind: measure(kind, args, saved) for kind in args.only}
    ceiling = results.get("ceiling")
    header = (
        f"| {'contender':<16} | {'engine':<10} | {'procs×thr':<9} | {'tokens':>11} | {'seconds':>7} "
        f"| {'tokens/s':>11} | {'× ceiling':>9} | {'peak RSS MB':>11} |"
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for kind, r in results.items():
        rate = r["tokens"] / r["seconds"]
        ratio = f"{rate / (ceiling['tokens'] / ceiling['seconds']):.2f}" if ceiling else "-"
        engine = r.get("engine", "tokenizers" if kind == "ceiling" else "datasets.map")
        print(
            f"| {kind:<16} | {engine:<10} | {r.get('procs_x_threads', '-'):<9} | {r['tokens']:>11,} | "
            f"{r['seconds']:>7.2f} | {rate:>11,.0f} | {ratio:>9} | {r['peak_rss_mb']:>11,} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"corpus_mb": mb, "cores": os.cpu_count(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
