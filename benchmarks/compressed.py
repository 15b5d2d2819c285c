"""convert of compressed shards against the same text uncompressed, measured in the same run.

    python benchmarks/compressed.py --corpus bench/corpus.jsonl [--repeats 3]
    python benchmarks/compressed.py --corpus bench/instruct.jsonl --text-template '{instruction}\n{input}\n{output}'

(`python benchmarks/make_corpus.py --out bench/corpus.jsonl --mb 50` makes a corpus of real text.)
The corpus is written as `.jsonl.zst` (zstandard level 3, what `zstd` does by default) and
`.jsonl.gz` (gzip level 6, what `gzip` does by default) in a temporary folder; the plain file and
each compressed one are converted in turn, interleaved, --repeats rounds after one of warm-up (the
machine is shared: the best run is the least disturbed one). Printed: wall and CPU seconds of each
(best), the ratios of speeds (plain seconds / compressed seconds: 1.0 = as fast as plain) of the
best runs, and min / median / max of each round's ratio (plain and compressed converted one after
the other, under about the same load); by CPU seconds of the process (both threads) and of the
parser's thread alone (zstd and gzip files of 1 MiB and more are decompressed by a thread beside
it: with a core free for that thread, the wall time follows the parser's), and the decompressors
alone (MB of text out per second) for gzip by the standard library's zlib and by isal, and for zstd
as moai reads it.
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` (imported by pandas through
# pyarrow) when a script of this folder runs, because Python puts the script's folder first on sys.path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import gzip
import json
import statistics
import tempfile
import time
from pathlib import Path

COMPRESSED = ("zst", "zst-in-parser", "gz")


def convert_seconds(path: Path, work: Path, template: str | None) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of this process, CPU seconds of the parser's thread) of one convert
    of `path`. The parser's thread is the critical path: with a core free for the decompressing
    thread, the wall time follows it."""
    import shutil

    from moai.config import parse_config
    from moai.stages.convert import convert, source_fingerprint

    fields = {"text_template": template} if template else {}
    source = parse_config({"source": {"path": str(path), **fields}, "tokenizer": {"path": "t"}}).source
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    fp = source_fingerprint(source)
    started, cpu, parser = time.perf_counter(), time.process_time(), time.thread_time()
    convert(source, out, source_fp=fp, writer_batch_size=10_000, max_shard_size="500MB")
    seconds, cpu, parser = time.perf_counter() - started, time.process_time() - cpu, time.thread_time() - parser
    shutil.rmtree(out)
    return seconds, cpu, parser


def read_speed(opener, path: Path, text_bytes: int) -> float:
    """MB of text per second that `opener(path)` gives, read to the end in 4 MiB chunks."""
    started = time.perf_counter()
    with opener(path) as f:
        while f.read(1 << 22):
            pass
    return text_bytes / 1e6 / (time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a .jsonl file of real text")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--text-template", help="source.text_template (records of make_corpus.py --records)")
    args = ap.parse_args()

    import zstandard
    from isal import igzip

    from moai.stages.convert import readers
    from moai.stages.convert.compressed import decompressing

    data = args.corpus.read_bytes()
    text_mb = round(len(data) / 1e6, 1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plain = work / "corpus.jsonl"
        plain.write_bytes(data)
        zst = work / "corpus.jsonl.zst"
        zst.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
        gz = work / "corpus.jsonl.gz"
        gz.write_bytes(gzip.compress(data, compresslevel=6))
        # "zst-in-parser": the same .zst decompressed by the parser's thread (no thread beside it)
        files = {"plain": plain, "zst": zst, "zst-in-parser": zst, "gz": gz}
        sizes = {name: round(path.stat().st_size / 1e6, 1) for name, path in files.items()}
        threshold = readers.AHEAD_MIN_BYTES
        walls: dict[str, list[float]] = {name: [] for name in files}
        cpus: dict[str, list[float]] = {name: [] for name in files}
        parsers: dict[str, list[float]] = {name: [] for name in files}
        for round_ in range(args.repeats + 1):  # round 0 warms up (imports, page cache): not counted
            for name, path in files.items():
                readers.AHEAD_MIN_BYTES = 1 << 62 if name == "zst-in-parser" else threshold
                wall, cpu, parser = convert_seconds(path, work, args.text_template)
                if round_:
                    walls[name].append(wall)
                    cpus[name].append(cpu)
                    parsers[name].append(parser)
        best = {name: min(v) for name, v in walls.items()}
        best_cpu = {name: min(v) for name, v in cpus.items()}
        median_parser = {name: statistics.median(v) for name, v in parsers.items()}
        # each round's ratio pairs the plain file with the compressed one converted right after it,
        # under about the same load from the machine's other work
        rounds = {k: sorted(p / c for p, c in zip(walls["plain"], walls[k], strict=True)) for k in COMPRESSED}

        def moai_zstd(p: Path):
            return decompressing(open(p, "rb"), "zstd")

        readers = {
            "gzip by zlib (gzip.open)": (gzip.open, gz),
            "gzip by isal (igzip.open)": (igzip.open, gz),
            "zstd by zstandard (moai's frame reader)": (moai_zstd, zst),
        }
        speeds = {
            name: max(read_speed(o, p, len(data)) for _ in range(args.repeats)) for name, (o, p) in readers.items()
        }
    result = {
        "text_mb": text_mb,
        "file_mb": sizes,
        "convert_seconds": {k: round(v, 3) for k, v in best.items()},
        "speed_vs_plain": {k: round(best["plain"] / best[k], 3) for k in COMPRESSED},
        "speed_vs_plain_by_round": {
            k: {"min": round(v[0], 3), "median": round(statistics.median(v), 3), "max": round(v[-1], 3)}
            for k, v in rounds.items()
        },
        # CPU seconds: what the machine's other work does not inflate (it does the wall time, on a shared machine)
        "convert_cpu_seconds": {k: round(v, 3) for k, v in best_cpu.items()},
        "cpu_speed_vs_plain": {k: round(best_cpu["plain"] / best_cpu[k], 3) for k in COMPRESSED},
        # the parser's thread alone (decompression runs beside it), medians: the speed with a free core
        "parser_thread_cpu_seconds_median": {k: round(v, 3) for k, v in median_parser.items()},
        "parser_thread_cpu_speed_vs_plain": {
            k: round(median_parser["plain"] / median_parser[k], 3) for k in COMPRESSED
        },
        "decompress_mb_per_s": {k: round(v) for k, v in speeds.items()},
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
