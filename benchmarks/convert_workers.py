"""convert alone with N worker processes parsing JSON lines (`resources.convert_workers`), against
one thread, on the same file in the same run; the outputs compared byte for byte.

    python benchmarks/convert_workers.py --corpus bench/instruct.jsonl \\
        --text-template $'{instruction}\\n{input}\\n{output}' --workers 1 2 4 8 --rounds 2

Each round runs every worker count once, in the order given (interleaved over rounds, so load on a
shared machine falls on all alike). Printed: seconds (best; each round), MB/s of the file, × one
thread, and whether the dataset's files equal the first count's, byte for byte.
"""

from __future__ import annotations

import os
import sys

# This folder's tokenize.py shadows the standard library's `tokenize` when a script here runs.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import hashlib
import shutil
import tempfile
import time
from pathlib import Path


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--text-template")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work", type=Path, help="where the outputs go (default: a temporary folder)")
    args = parser.parse_args()

    from moai.config import parse_config
    from moai.stages.convert import convert, source_fingerprint

    source: dict = {"path": str(args.corpus)}
    if args.text_template:
        source["text_template"] = args.text_template
    cfg = parse_config({"source": source, "tokenizer": {"path": "unused"}})
    assert cfg.source is not None
    fp = source_fingerprint(cfg.source)
    mb = args.corpus.stat().st_size / 1e6
    work = args.work or Path(tempfile.mkdtemp(prefix="moai-convert-"))
    times: dict[int, list[float]] = {w: [] for w in args.workers}
    digests: dict[int, str] = {}
    try:
        for _ in range(args.rounds):
            for w in args.workers:
                out = work / f"workers-{w}"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                started = time.perf_counter()
                convert(cfg.source, out, source_fp=fp, writer_batch_size=10_000, max_shard_size="256MB", workers=w)
                times[w].append(time.perf_counter() - started)
                digests[w] = digest(out)
                shutil.rmtree(out)
                print(f"workers {w}: {times[w][-1]:.2f} s", file=sys.stderr, flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    base = min(times[args.workers[0]])
    print(f"convert of {args.corpus} ({mb:,.0f} MB), {os.cpu_count()} cores")
    print("| workers | seconds (best; each round) | MB/s | × first | same bytes as first |")
    print("|---:|---:|---:|---:|---|")
    for w in args.workers:
        best = min(times[w])
        each = ", ".join(f"{t:.2f}" for t in times[w])
        same = "yes" if digests[w] == digests[args.workers[0]] else "NO"
        print(f"| {w} | {best:.2f} ({each}) | {mb / best:,.0f} | {base / best:.2f} | {same} |")


if __name__ == "__main__":
    main()
