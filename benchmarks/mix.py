"""Time and peak memory of building the mix stage's sample index: 3 sources, 10M samples by default.

    python benchmarks/mix.py [--samples 10000000] [--seq-len 2048] [--repeats 3]

The sources are synthetic window counts (ko 2M windows at weight 0.6, so it repeats three times;
code 5M at 0.3; en 20M at 0.1), cut by `pack.concat_chunk` and mixed by the stage's own functions
(`allot`, `refuse`, `mix_samples`), then saved with `np.save` as the stage saves it. The baseline,
measured in the same run, is `np.random.default_rng(0).permutation(samples)`: seconds and peak
memory are printed as ratios against it, so the figures compare across machines. Peak memory is
tracemalloc's (NumPy reports its buffers to it); the index itself is 24 bytes a sample.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from fractions import Fraction
from pathlib import Path

import numpy as np

from moai.stages import mix
from moai.stages.pack import concat_chunk

SOURCES = {"ko": (0.6, 2_000_000, 4.0), "code": (0.3, 5_000_000, 1.0), "en": (0.1, 20_000_000, 1.0)}


def measure(fn) -> tuple[float, float]:
    """(seconds, peak MB) of one call."""
    tracemalloc.start()
    started = time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    return seconds, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    args = ap.parse_args()
    names = list(SOURCES)
    weights = [SOURCES[n][0] for n in names]
    reps = [SOURCES[n][2] for n in names]
    windows = [concat_chunk(SOURCES[n][1] * args.seq_len, args.seq_len, drop_remainder=True) for n in names]
    out = Path(tempfile.mkdtemp(prefix="moai-mix-bench-"))

    def build() -> None:
        shares = [Fraction(w) / sum(Fraction(x) for x in weights) for w in weights]
        counts = mix.allot(shares, args.samples)
        mix.refuse(names, weights, reps, [len(w) for w in windows], counts, args.seq_len)
        np.save(out / "train.npy", mix.mix_samples(windows, counts, 0, names))

    def baseline() -> None:
        np.random.default_rng(0).permutation(args.samples)

    runs = [(measure(build), measure(baseline)) for _ in range(args.repeats)]
    (t, mem), (t0, mem0) = min(r[0] for r in runs), min(r[1] for r in runs)
    index = np.load(out / "train.npy", mmap_mode="r")
    counts = np.bincount(index[:, 0], minlength=len(names)).tolist()
    (out / "train.npy").unlink()
    out.rmdir()
    print(
        json.dumps(
            {
                "samples": args.samples,
                "sources": {n: {"weight": w, "samples": c} for n, w, c in zip(names, weights, counts, strict=True)},
                "seconds": round(t, 3),
                "peak_mb": round(mem, 1),
                "bytes_per_sample": round(mem * 1e6 / args.samples, 1),
                "baseline_seconds": round(t0, 3),
                "baseline_peak_mb": round(mem0, 1),
                "seconds_ratio": round(t / t0, 2),
                "memory_ratio": round(mem / mem0, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
