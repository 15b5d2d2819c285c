"""What the reuse check costs on a multi-GB published folder, against `moai cache verify`.

Builds one store entry of `--gb` GB in `--files` files (plus a few small JSON files) through
`moai.store.Store.build`, then times `Store.read` (what every reuse runs: sizes, the manifest's own
digest, small files hashed whole, 16 sampled 4 KiB blocks of each large file) and `verify_cache`
(every byte). The page cache is dropped between runs when this runs as root (`--cold`), so the
cold figures are reads from the disk. Removes its folder at the end.

    python benchmarks/reuse_check.py --dir /tmp/reuse-bench --gb 4 --files 16 --cold
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    from moai.cache import verify_cache
    from moai.store import Store

    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each timing (root)")
    args = ap.parse_args()
    root = Path(args.dir)
    per_file = int(args.gb * 1e9 / args.files)
    block = os.urandom(1 << 20)

    def builder(out: Path) -> dict:
        for i in range(args.files):
            with open(out / f"part-{i:05d}.bin", "wb") as f:
                for _ in range(per_file >> 20):
                    f.write(block)
            (out / f"part-{i:05d}.idx").write_bytes(os.urandom(64 << 10))
        (out / "tokens.json").write_text(json.dumps({"parts": args.files}))
        return {}

    try:
        started = time.perf_counter()
        pub = Store(root).build("tokenize", "b" * 20, builder)
        build_s = time.perf_counter() - started
        total = sum(r["bytes"] for r in pub.manifest["files"].values())
        rows = []
        for what, fn in (
            ("reuse check (Store.read)", lambda: Store(root).read("tokenize", "b" * 20)),
            ("moai cache verify", lambda: list(verify_cache(root))),
        ):
            for cache in ("cold", "warm") if args.cold else ("warm",):
                if cache == "cold" and not drop_caches():
                    continue
                started = time.perf_counter()
                fn()
                rows.append((what, cache, time.perf_counter() - started))
        print(f"entry: {total / 1e9:.2f} GB in {len(pub.manifest['files'])} files; built in {build_s:.1f} s")
        for what, cache, seconds in rows:
            print(f"{what:<26} {cache:<5} {seconds * 1000:9.1f} ms")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
