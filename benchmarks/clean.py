"""Throughput of the cleaning stages, each on the output of the one before, cold.

    python benchmarks/clean.py [--docs 25000] [--corpus DIR] [--work DIR] [--num-proc N]

The corpus is benchmarks/clean_corpus.py's mixed one (English and Korean prose, code, other
languages, low-quality pages, copies, near copies, planted evaluation questions); convert and
filter run first (not counted). Then signatures, dedup (exact + near, verified), quality
(gopher), language (keep ko, en) and decontaminate run through `moai.pipeline` into a fresh
cache, and each stage's rows, seconds, MB/s and documents/s are printed, with the load average
(the figures move with other work on the machine).
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` when this folder is first on sys.path
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path

STAGES = ("signatures", "dedup", "quality", "language", "decontaminate")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=25_000)
    ap.add_argument("--corpus", type=Path, help="a folder written by clean_corpus.py (default: generate one)")
    ap.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    ap.add_argument("--num-proc", type=int, help="resources.num_proc (default: the hardware plan)")
    args = ap.parse_args()

    spec = importlib.util.spec_from_file_location("clean_corpus", Path(__file__).with_name("clean_corpus.py"))
    assert spec is not None and spec.loader is not None
    clean_corpus = importlib.util.module_from_spec(spec)
    sys.modules["clean_corpus"] = clean_corpus  # its dataclasses look themselves up there
    spec.loader.exec_module(clean_corpus)

    from moai import pipeline
    from moai.config import parse_config

    work = args.work or Path(tempfile.mkdtemp(prefix="moai-clean-bench-"))
    corpus = args.corpus or work / "corpus"
    if args.corpus is None:
        clean_corpus.generate(corpus, args.docs)
    config = parse_config(
        {
            "cache_dir": str(work / "cache"),
            "source": {"path": str(corpus / "data.jsonl")},
            "dedup": {"exact": True, "near": {"threshold": 0.8}},
            "quality": {"rules": "gopher"},
            "language": {"keep": ["ko", "en"]},
            "decontaminate": {"path": str(corpus / "evals.jsonl"), "text_field": "question"},
            "tokenizer": {"path": str(Path(__file__).resolve().parent.parent / "examples" / "tokenizer")},
            "resources": {"num_proc": args.num_proc} if args.num_proc else {},
        }
    )
    load_before = os.getloadavg()[0]
    results = pipeline.walk(config, until="decontaminate")
    rows = {}
    for name in STAGES:
        r = results[name].report
        rows[name] = {
            "rows_in": r["rows_in"],
            "rows_out": r["rows_out"],
            "dropped": r.get("dropped", {}),
            "seconds": r["seconds"],
            "mb_in": r.get("mb_in"),
            "mb_per_s": r.get("mb_per_s"),
            "docs_per_s": round(r["rows_in"] / r["seconds"]) if r["seconds"] else None,
        }
    print(f"{'stage':<14} {'rows in → out':>18} {'seconds':>8} {'MB in':>7} {'MB/s':>7} {'docs/s':>8}")
    for name, r in rows.items():
        io = f"{r['rows_in']:,} → {r['rows_out']:,}"
        figures = f"{r['seconds']:>8.2f} {r['mb_in']:>7.1f} {r['mb_per_s']:>7.1f} {r['docs_per_s']:>8,}"
        print(f"{name:<14} {io:>18} {figures}")
    print(json.dumps({"load_average_before_after": [load_before, os.getloadavg()[0]], "stages": rows}, indent=1))


if __name__ == "__main__":
    main()
