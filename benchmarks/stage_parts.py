"""The tokenize stage's parts alone (no check, no other stage), from several checkouts of moai, alternated.

    python benchmarks/stage_parts.py --saved SAVED --tokenizer bench/tok-llama3 \\
        --checkouts /tmp/base . --rounds 8

For small changes to the stage's encode-and-write loop (`moai.stages.tokenize.parts`), whose
effect (a few percent) is smaller than what one cold `moai prepare` varies from run to run. SAVED
is a save stage's output (`moai prepare` leaves it under `<cache_dir>/save/<key>`;
`prepare_e2e.py --work DIR` under `DIR/saved-cache/save/<key>`). Each run is a fresh process
that builds fastokens for the tokenizer, plans the parts and times `parts.encode_parts` over all
of them (reading the text into `str`s, encoding, writing the ids), its output deleted after. The
checkouts run in turn, the order rotated every round, so drift on a shared machine falls on each
alike. Per checkout: median and least of the wall seconds, the process's user and system CPU
seconds, the encode calls' wall seconds (`encode`, both threads' calls summed: beyond `encode_cpu`,
the calls waited for a core or for the GIL), the profile's CPU seconds by thread (`encode_cpu`:
the encode threads, `read_cpu`: texts into `str`s, `write_cpu`: the writer), minor page faults,
and how far the process' anonymous RSS rose over the parts (`grew_mb`). With `--fraction 0.25`,
only the first quarter of the parts: the memory the parts hold for a quarter of the corpus
against all of it.

The same code twice (an A/A: `/tmp/base` a copy of this checkout's `moai/`), eight rounds on this
2-core VM (2026-11-28 05:42 UTC): medians 1.83 and 1.90 s, least 1.55 and 1.70 s. A difference of
a few percent needs more rounds than that, and CPU seconds read beside wall time.
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
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

KEYS = ("wall", "user", "sys", "encode", "encode_cpu", "read_cpu", "write_cpu", "minflt", "grew_mb")


def anon_mb() -> float:
    """This process' anonymous resident memory, MB: RSS less the file-backed and shared pages
    (psutil's `shared`; on Linux RssAnon), so the mapped text the parts read is not counted."""
    import psutil

    m = psutil.Process().memory_info()
    return (m.rss - getattr(m, "shared", 0)) / 2**20


def run_once(saved: Path, tokenizer: Path, out: Path, fraction: float = 1.0) -> dict:
    """In this process (a fresh one, moai from PYTHONPATH): the parts, timed; `grew_mb`, how far
    the process' anonymous RSS rose above where it was before them (sampled every 20 ms)."""
    import threading

    from moai import heap
    from moai.stages.tokenize import engine, parts
    from moai.stages.tokenizer import describe, load_tokenizer

    info = describe(load_tokenizer(str(tokenizer)), str(tokenizer), "benchmark")
    engine.init_encoder(engine.engine_setup("fastokens", info, os.cpu_count() or 1), None, ["warm-up"] * 64)
    jobs = parts.plan_parts(info, saved, out, 10_000)
    jobs = jobs[: max(1, round(len(jobs) * fraction))]
    for split in parts.SPLITS:
        (out / split).mkdir(parents=True, exist_ok=True)
    heap.trim()
    start_mb, peak_mb, done = anon_mb(), [0.0], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak_mb[0] = max(peak_mb[0], anon_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    results = parts.encode_parts(jobs)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    done.set()
    sampler.join()
    profile = results[0]["profile"]
    return {
        "wall": wall,
        "user": after.ru_utime - before.ru_utime,
        "sys": after.ru_stime - before.ru_stime,
        "minflt": after.ru_minflt - before.ru_minflt,
        "grew_mb": max(peak_mb[0], anon_mb()) - start_mb,
        **{k: profile[k] for k in ("encode", "encode_cpu", "read_cpu", "write_cpu")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saved", type=Path, required=True, help="a save stage's output folder")
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--checkouts", nargs="+", default=["."], help="folders holding a moai/ package")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--fraction", type=float, default=1.0, help="the first share of the parts only (e.g. 0.25)")
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)  # the child: its output folder
    args = parser.parse_args()
    if args.run is not None:
        try:
            print(json.dumps(run_once(args.saved.resolve(), args.tokenizer.resolve(), args.run, args.fraction)))
        finally:
            shutil.rmtree(args.run, ignore_errors=True)
        return
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give at least 1")
    checkouts = [str(Path(c).resolve()) for c in args.checkouts]
    for c in checkouts:
        if not (Path(c) / "moai" / "__init__.py").is_file():
            parser.error(f"--checkouts {c}: no moai/ package there")
    rows: dict[str, list[dict]] = {c: [] for c in checkouts}
    with tempfile.TemporaryDirectory(prefix="moai-stage-parts-") as work:
        for r in range(args.rounds):
            order = checkouts[r % len(checkouts) :] + checkouts[: r % len(checkouts)]
            for c in order:
                argv = [sys.executable, __file__, "--saved", str(args.saved.resolve()), "--tokenizer"]
                argv += [str(args.tokenizer.resolve()), "--run", str(Path(work) / "out")]
                argv += ["--fraction", str(args.fraction)]
                # the checkout's moai first on the path; run from the work folder, not this one
                env = {**os.environ, "PYTHONPATH": c}
                done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work)
                if done.returncode:
                    sys.exit(f"{c}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
                rows[c].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"round {r + 1} {c}: {rows[c][-1]}", file=sys.stderr, flush=True)
    print("| checkout | runs | " + " | ".join(f"{k} (median, least)" for k in KEYS) + " |")
    print("|---|---:|" + "---:|" * len(KEYS))
    for c, rs in rows.items():
        cells = []
        for k in KEYS:
            values = [r[k] for r in rs]
            fmt = "{:,.0f}" if k in ("minflt", "grew_mb") else "{:.3f}"
            cells.append(f"{fmt.format(statistics.median(values))}, {fmt.format(min(values))}")
        print(f"| {c} | {len(rs)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
