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

The manifest lists every file of the folder with its size and xxh3-128 digest, taken just
before publishing while the files are still in the page cache: 10-15 ms for 50 MB on one core,
against 50-100 ms to write them (read back from disk, as `moai cache verify` does: ~100 ms). Every
reuse checks that each listed file is there with its size (a `stat` per file, no reading), so a
truncated or deleted file is named with its fix (`CacheError`) instead of feeding a later stage
short data; `verify_cache` (`moai cache verify`) also checks the digests and lists files nobody
recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from moai.errors import CacheError

log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"
KEY_LENGTH = 20
FILES = "files"  # manifest key: relative path -> {"bytes": size, "xxh3_128": hex digest}


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
        """The published output of (stage, key), after checking its files are all there at their
        recorded sizes (`CacheError` naming the folder and the fix if not)."""
        path = self.path(stage, key)
        manifest = load_manifest(path)
        problems = size_problems(path, manifest.get(FILES))
        if problems:
            raise CacheError.damaged(path, _first(problems))
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
                log.info(
                    "%s %s: built by another process while waiting (%.1fs)", stage, key, time.perf_counter() - waited
                )
                return self.read(stage, key)
            final = self.path(stage, key)
            if final.exists():  # a folder without manifest cannot come from us; never trust it
                raise CacheError.damaged(final, f"it has no {MANIFEST}")
            for stale in stage_dir.glob(f".tmp-{key}-*"):
                log.warning("%s %s: removing %s left by a builder that died", stage, key, stale.name)
                shutil.rmtree(stale, ignore_errors=True)
            tmp = stage_dir / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            try:
                started = time.perf_counter()
                report = builder(tmp)
                files = describe_files(tmp)
                from moai import __version__

                full = {
                    "stage": stage,
                    "key": key,
                    "moai_version": __version__,
                    **(manifest or {}),
                    "report": report,
                    "build_seconds": round(time.perf_counter() - started, 3),
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    FILES: files,
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


# -- what a published folder holds, and checking it ----------------------------------------------


def describe_files(folder: Path) -> dict[str, dict[str, Any]]:
    """Every file under `folder` except its manifest: relative path -> size in bytes and xxh3-128."""
    return {
        rel: {"bytes": (folder / rel).stat().st_size, "xxh3_128": file_digest(folder / rel)}
        for rel in _relative_files(folder)
    }


def file_digest(path: Path, chunk_bytes: int = 1 << 22) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def _relative_files(folder: Path) -> list[str]:
    """Relative POSIX paths of the files under `folder`, sorted, its top-level manifest left out."""
    out = []
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            full = Path(dirpath) / name
            if full.is_file():
                out.append(full.relative_to(folder).as_posix())
    return sorted(rel for rel in out if rel != MANIFEST)


def load_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a published folder; `CacheError` if it cannot be read or is malformed."""
    manifest = _read_manifest(path)
    if isinstance(manifest, str):
        raise CacheError.damaged(path, manifest)
    return manifest


def _read_manifest(path: Path) -> dict[str, Any] | str:
    """The manifest, or what is wrong with it."""
    file = path / MANIFEST
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        return f"its {MANIFEST} cannot be read ({type(err).__name__}: {err})"
    if not text.strip():
        return f"its {MANIFEST} is empty"
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        return f"its {MANIFEST} is not valid JSON ({err})"
    if not isinstance(manifest, dict):
        return f"its {MANIFEST} holds a {type(manifest).__name__}, not an object"
    files = manifest.get(FILES)
    if files is not None and not (
        isinstance(files, dict)
        and all(
            isinstance(r, dict) and isinstance(r.get("bytes"), int) and isinstance(r.get("xxh3_128"), str)
            for r in files.values()
        )
    ):
        return f"the {FILES!r} list of its {MANIFEST} is malformed"
    return manifest


def size_problems(path: Path, files: dict[str, dict[str, Any]] | None) -> list[str]:
    """What differs between the recorded files and the folder, by `stat` alone (O(files), no reading).
    A manifest without a file list (older moai) has nothing to check."""
    return [problem for rel, rec in (files or {}).items() if (problem := _size_problem(path, rel, rec))]


def content_problems(path: Path, files: dict[str, dict[str, Any]]) -> list[str]:
    """Sizes, then the digest of every file of the right size, then files nobody recorded."""
    problems = []
    for rel, rec in files.items():
        problem = _size_problem(path, rel, rec)
        if problem is None:
            try:
                if file_digest(path / rel) != rec["xxh3_128"]:
                    problem = f"{rel} has other content than its manifest records (xxh3-128 differs)"
            except OSError as err:
                problem = f"{rel} cannot be read ({err.strerror})"
        if problem:
            problems.append(problem)
    problems += [f"{rel} is not in its manifest" for rel in _relative_files(path) if rel not in files]
    return problems


def _size_problem(path: Path, rel: str, rec: dict[str, Any]) -> str | None:
    try:
        size = (path / rel).stat().st_size
    except FileNotFoundError:
        return f"{rel} is missing"
    except OSError as err:
        return f"{rel} cannot be read ({err.strerror})"
    return None if size == rec["bytes"] else f"{rel} has {size} bytes, its manifest says {rec['bytes']}"


def _first(problems: list[str]) -> str:
    """One line for many problems: the first, and how many more."""
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


OK, DAMAGED, UNVERIFIABLE = "ok", "damaged", "unverifiable"


@dataclass(frozen=True)
class EntryCheck:
    """The verdict on one published folder of a cache, and a one-line message saying why."""

    stage: str
    key: str
    path: Path
    status: str  # OK, DAMAGED or UNVERIFIABLE
    problems: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        if self.status == DAMAGED:
            return str(CacheError.damaged(self.path, _first(list(self.problems))))
        if self.status == UNVERIFIABLE:
            return (
                f"cache entry {self.path} is unverifiable: its {MANIFEST} has no file list (written by an older "
                "moai); if in doubt remove the folder: it will be rebuilt when needed"
            )
        return f"cache entry {self.path} is ok"


def verify_cache(root: str | os.PathLike) -> Iterator[EntryCheck]:
    """Check every published folder `<root>/<stage>/<key>/` (one with a manifest), in sorted order:
    sizes and digests of the recorded files, and files nobody recorded. Hidden names (builds in
    progress or left by a dead builder, lock files) are not published and are skipped; a folder
    without a manifest is not a store entry (a training run's output, say) and is skipped too."""
    root = Path(root)
    if not root.is_dir():
        raise CacheError(f"{root} is not a folder: no cache to verify (give the cache_dir of a config)")
    for stage_dir in _visible_dirs(root):
        for path in _visible_dirs(stage_dir):
            if (path / MANIFEST).is_file():
                yield check_entry(path)


def check_entry(path: Path) -> EntryCheck:
    """The verdict on one published folder (see `verify_cache`)."""
    stage, key = path.parent.name, path.name
    manifest = _read_manifest(path)
    if isinstance(manifest, str):
        return EntryCheck(stage, key, path, DAMAGED, (manifest,))
    files = manifest.get(FILES)
    if files is None:
        return EntryCheck(stage, key, path, UNVERIFIABLE)
    problems = content_problems(path, files)
    return EntryCheck(stage, key, path, DAMAGED if problems else OK, tuple(problems))


def _visible_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


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
