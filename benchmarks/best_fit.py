"""Time of building a best-fit sample index (`pack.mode: best_fit`), with its padding and split figures.

    python benchmarks/best_fit.py [--documents 10000000] [--seq-len 2048] [--repeats 1]

Document lengths are synthetic: lognormal (median e^6 ≈ 400 tokens, sigma 1.2, so ~9% are longer
than 2,048), seeded. What is timed is `pack.best_fit_rows` on the document offsets, the whole of
the stage's work for one split apart from reading the offsets and saving two arrays. Printed: one
JSON line with seconds (best of --repeats), rows, padding fraction, documents split (those longer
than seq_len: the only ones best fit cuts) and, for comparison, how many documents concat would
split at the same seq_len.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from moai.stages.pack import best_fit_report, best_fit_rows, documents_split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", type=int, default=10_000_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=1, help="best of this many runs")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    lengths = np.maximum(1, rng.lognormal(6.0, 1.2, args.documents)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    best = float("inf")
    for _ in range(args.repeats):
        started = time.perf_counter()
        rows, pieces = best_fit_rows(offsets, args.seq_len)
        best = min(best, time.perf_counter() - started)
    report = best_fit_report(rows, offsets, args.seq_len)
    assert int(rows[:, 3].sum()) == int(offsets[-1])  # every token in a row
    print(
        json.dumps(
            {
                "documents": args.documents,
                "tokens": int(offsets[-1]),
                "seq_len": args.seq_len,
                "seconds": round(best, 2),
                **report,
                "pieces": len(pieces),
                "concat_documents_split": documents_split(offsets, args.seq_len),
            }
        )
    )


if __name__ == "__main__":
    main()
