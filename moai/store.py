"""The crash-safe, content-keyed store every stage writes into.

Layout: `<cache_dir>/<stage>/<key>/`, where `key` hashes the upstream key (ultimately the
source's fingerprint), the stage's settings and the stage's version. A build happens in a
hidden temporary folder beside its final place and becomes visible by one `rename` while the
builder holds an `fcntl` lock on the key. So:

- a reader sees either nothing or a complete folder with its `_manifest.json`;
- racing processes build each key once; the others wait for the lock and then reuse it;
- a builder killed with SIGKILL leaves only a hidden `.tmp-*` folder, and the kernel frees its
  lock; the next builder of that key removes the leftover and starts again;
- a published folder is never written again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock

log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"
KEY_LENGTH = 20


def stage_key(stage: str, version: int, upstream: str | list[str], settings: dict[str, Any]) -> str:
    """Deterministic key of a stage output: hash of stage, version, upstream key(s), settings."""
    blob = json.dumps(
        {"stage": stage, "version": version, "upstream": upstream, "settings": settings},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:KEY_LENGTH]


def fingerprint_files(paths: list[Path], chunk_bytes: int = 1 << 22) -> str:
    """Content fingerprint of local files: names (relative order kept) and bytes, via xxh3-128."""
    import xxhash

    h = xxhash.xxh3_128()
    for p in paths:
        h.update(f"{p.name}\0{p.stat().st_size}\0".encode())
        with open(p, "rb") as f:
            while chunk := f.read(chunk_bytes):
                h.update(chunk)
    return h.hexdigest()


def fingerprint_dir(path: Path, names: list[str] | None = None) -> str:
    """Content fingerprint of the files of a folder (all regular files, or those in `names`)."""
    files = sorted(p for p in path.iterdir() if p.is_file() and (names is None or p.name in names))
    return fingerprint_files(files)


@dataclass(frozen=True)
class Published:
    """A stage output in the store: where it is, its manifest, and whether this call built it."""

    stage: str
    key: str
    path: Path
    manifest: dict[str, Any]
    built: bool


class Store:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def exists(self, stage: str, key: str) -> bool:
        return (self.path(stage, key) / MANIFEST).is_file()

    def read(self, stage: str, key: str) -> Published:
        path = self.path(stage, key)
        manifest = json.loads((path / MANIFEST).read_text())
        return Published(stage, key, path, manifest, built=False)

    def build(
        self,
        stage: str,
        key: str,
        builder: Callable[[Path], dict[str, Any]],
        manifest: dict[str, Any] | None = None,
    ) -> Published:
        """Return the published output of (stage, key), building it with `builder(tmp_dir)` if absent.

        `builder` writes into the empty folder it is given and returns the stage report, which goes
        into the manifest together with `manifest` (inputs, settings).
        """
        if self.exists(stage, key):
            return self.read(stage, key)
        stage_dir = self.root / stage
        stage_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(stage_dir / f".{key}.lock"))
        waited = time.perf_counter()
        with lock:
            if self.exists(stage, key):
                log.info("%s %s: built by another process while waiting (%.1fs)", stage, key, time.perf_counter() - waited)
                return self.read(stage, key)
            final = self.path(stage, key)
            if final.exists():  # a folder without manifest cannot come from us; never trust it
                raise RuntimeError(f"{final} exists but has no {MANIFEST}; remove it by hand")
            for stale in stage_dir.glob(f".tmp-{key}-*"):
                log.warning("%s %s: removing %s left by a builder that died", stage, key, stale.name)
                shutil.rmtree(stale, ignore_errors=True)
            tmp = stage_dir / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            try:
                started = time.perf_counter()
                report = builder(tmp)
                from moai import __version__

                full = {
                    "stage": stage,
                    "key": key,
                    "moai_version": __version__,
                    **(manifest or {}),
                    "report": report,
                    "build_seconds": round(time.perf_counter() - started, 3),
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                }
                _write_json_durable(tmp / MANIFEST, full)
                _fsync_dir(tmp)
                os.rename(tmp, final)
                _fsync_dir(stage_dir)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        log.info("%s %s: published %s", stage, key, final)
        return Published(stage, key, final, full, built=True)


def _write_json_durable(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
