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
against 50-100 ms to write them (read back from disk, as `moai cache verify` does: ~100 ms), or
by the file's writer as it wrote it (`remember_digests`: the tokenize stage's ids, written past
the page cache), and a digest of itself. Every reuse checks the manifest against that digest,
that each listed file is there with its size, hashes the small files (up to 1 MiB: JSON,
indexes, sample-index metadata) whole and a larger one's 16 sampled blocks (`content_problems`),
so a truncated, deleted or overwritten file is named with its fix (`CacheError`) instead of
feeding a later stage wrong data; `verify_cache` (`moai cache verify`) checks every byte and
lists files nobody recorded (`moai.cache`).

Faults of the machine are one line too (`CacheError`): a stage folder that cannot be created or
written, a lock file that cannot be opened, a disk that fills during a build (the line names the
stage, the folder, the bytes written and the space left; the partial build is removed). Every
reuse or build appends one line (stage, key, config, time) to the stage's hidden `.uses.jsonl`,
so `moai cache list` can say when an entry was last used and by which config; a cache that
cannot be written is still read, without that line. The log grows by ~120 bytes a stage a run.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from moai.errors import CacheError

if TYPE_CHECKING:
    from moai.remote_cache import RemoteCache

log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"
USES = ".uses.jsonl"  # <stage>/.uses.jsonl: one line per reuse or build (stage, key, config, time)
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
    def __init__(self, root: str | os.PathLike, origin: str | None = None, remote: RemoteCache | None = None):
        self.root = Path(root).resolve()
        self.origin = origin  # the config file or preset the builds are for, recorded with each use
        self.remote = remote  # a remote cache: pulled from on a miss, pushed to after a publish (moai.remote_cache)

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def exists(self, stage: str, key: str) -> bool:
        return (self.path(stage, key) / MANIFEST).is_file()

    def read(self, stage: str, key: str) -> Published:
        """The published output of (stage, key), after checking its manifest against its own digest
        and its files against the manifest: all there at their sizes, small ones hashed whole,
        large ones by sampled blocks (`CacheError` naming the folder and the fix if not)."""
        path = self.path(stage, key)
        manifest = load_manifest(path)
        problems = size_problems(path, manifest.get(FILES)) or content_problems(path, manifest.get(FILES))
        if problems:
            raise CacheError.damaged(path, first_problem(problems))
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
            return self._used(self._shared(self.read(stage, key)))
        stage_dir = self.root / stage
        try:
            stage_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _write_error(stage, stage_dir, err) from None
        lock = FileLock(str(lock_path(stage_dir, key)))
        waited = time.perf_counter()
        try:
            lock.acquire()
        except OSError as err:
            raise lock_error(lock_path(stage_dir, key), err) from None
        try:
            if self.exists(stage, key):
                log.info(
                    "%s %s: built by another process while waiting (%.1fs)", stage, key, time.perf_counter() - waited
                )
                return self._used(self.read(stage, key))
            if self.remote is not None and self.remote.mirrors(stage) and self.remote.pull(stage_dir, stage, key):
                return self._used(self.read(stage, key))
            pub = self._build_locked(stage, key, builder, manifest or {})
        finally:
            # Removed while still held, so a finished or interrupted build leaves no lock file: a
            # process waiting on this file gets it after the release, sees it was unlinked
            # (filelock >= 4) and locks a new one. Only SIGKILL leaves one (harmless: the kernel
            # freed its lock; `moai cache prune` removes it).
            with contextlib.suppress(OSError):
                os.unlink(lock.lock_file)
            lock.release()
        log.info("%s %s: published %s", stage, key, pub.path)
        return self._used(self._shared(pub))

    def _shared(self, pub: Published) -> Published:
        """Upload a published entry to the remote cache if there is one and it lacks the entry."""
        if self.remote is not None and self.remote.mirrors(pub.stage):
            self.remote.push(pub.path, pub.stage, pub.key)
        return pub

    def _build_locked(
        self, stage: str, key: str, builder: Callable[[Path], dict[str, Any]], manifest: dict[str, Any]
    ) -> Published:
        stage_dir, final = self.root / stage, self.path(stage, key)
        if final.exists():  # a folder without manifest cannot come from us; never trust it
            raise CacheError.damaged(final, f"it has no {MANIFEST}")
        for stale in stage_dir.glob(f".tmp-{key}-*"):
            log.warning("%s %s: removing %s left by a builder that died", stage, key, stale.name)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = stage_dir / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir()
        except OSError as err:
            raise _write_error(stage, stage_dir, err) from None
        try:
            started = time.perf_counter()
            report = builder(tmp)
            files = describe_files(tmp)
            from moai import __version__

            full = {
                "stage": stage,
                "key": key,
                "moai_version": __version__,
                **manifest,
                "report": report,
                "build_seconds": round(time.perf_counter() - started, 3),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                FILES: files,
            }
            _write_json_durable(tmp / MANIFEST, full)
            _write_durable(tmp / MANIFEST_DIGEST, manifest_digest((tmp / MANIFEST).read_bytes()).encode())
            _fsync_dir(tmp)
            os.rename(tmp, final)
            _fsync_dir(stage_dir)
        except BaseException as err:
            full_disk = _disk_full(err)  # measured before the partial build is removed: what was left
            error = None if full_disk is None else _full_error(stage, stage_dir, full_disk, tree_bytes(tmp))
            shutil.rmtree(tmp, ignore_errors=True)
            if error is not None:
                raise error from err
            raise
        return Published(stage, key, final, full, built=True)

    def _used(self, pub: Published) -> Published:
        """Append one line to the stage's use log (`moai cache list` reads it). A cache that cannot
        be written (read-only, full) is still read: the line is then left out."""
        line = json.dumps({"key": pub.key, "config": self.origin, "at": round(time.time(), 3), "built": pub.built})
        try:
            fd = os.open(pub.path.parent / USES, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())  # one write under PIPE_BUF: appends never interleave
            finally:
                os.close(fd)
        except OSError as err:
            log.debug("%s %s: use not recorded (%s)", pub.stage, pub.key, err)
        return pub


# -- faults of the machine, as one line each ------------------------------------------------------


def lock_path(stage_dir: Path, key: str) -> Path:
    """The lock a builder of `key` holds (`fcntl.flock`; the kernel frees it when the holder dies)."""
    return stage_dir / f".{key}.lock"


def lock_error(lock: Path, err: OSError) -> CacheError:
    import shlex

    if not lock.exists():
        return CacheError(
            f"cannot create the lock file {lock} ({err.strerror}): its folder {lock.parent} is not writable; make it "
            "writable (or set cache_dir to a folder you can write), then rerun"
        )
    return CacheError(
        f"cannot open the lock file {lock} ({err.strerror}); it holds no data: remove it "
        f"(rm -f {shlex.quote(str(lock))}) or make it writable, then rerun"
    )


def _write_error(stage: str, folder: Path, err: OSError) -> CacheError:
    """The line for a stage folder that cannot be created or written."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return _full_error(stage, folder, err, written=0)
    return CacheError(
        f"{stage}: cannot write the cache folder {folder} ({err.strerror}); make it writable "
        "(or set cache_dir to a folder you can write), then rerun"
    )


def _disk_full(err: BaseException | None) -> OSError | None:
    """The disk-full error behind `err`, if any: raised directly, or as the cause of a library's own
    error (pyarrow and datasets wrap it, sometimes keeping only the message)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and (
            err.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(err)
        ):
            return err
        err = err.__cause__ or err.__context__
    return None


def _full_error(stage: str, folder: Path, err: OSError, written: int) -> CacheError:
    from moai.hardware import free_bytes

    why = err.strerror or "No space left on device"
    return CacheError(
        f"{stage}: the disk is full ({why}) building into {folder}: {human_bytes(written)} written so far, "
        f"{human_bytes(free_bytes(folder))} free; nothing was published (the partial build is removed): free "
        "space or set cache_dir to a larger disk, then rerun"
    )


def tree_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` (0 if it is gone)."""
    total = 0
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):  # removed while we walk
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


# -- what a published folder holds, and checking it ----------------------------------------------


def describe_files(folder: Path) -> dict[str, dict[str, Any]]:
    """Every file under `folder` except its manifest: relative path -> size in bytes, xxh3-128 and,
    for a file over `SMALL_FILE_BYTES`, the digest of its sampled blocks (`sampled_digest`). A file
    whose digests were taken as it was written (`remember_digests`) is not read again."""
    out = {}
    for rel in relative_files(folder):
        st = (folder / rel).stat()
        known = _remembered(folder / rel, st)
        size = st.st_size
        rec: dict[str, Any] = {"bytes": size, "xxh3_128": known.get("xxh3_128") or file_digest(folder / rel)}
        if size > SMALL_FILE_BYTES:
            rec[SAMPLED] = known.get(SAMPLED) or sampled_digest(folder / rel, size)
        out[rel] = rec
    return out


# Digests taken by the writer of a file as it wrote it (`remember_digests`): publishing uses them
# instead of reading the file back, which for a file written past the page cache (the tokenize
# stage's ids, `moai.stages.tokenize.idsfile`) means reading it from the disk. Used once, and only
# while the file's inode, size and modification time are the ones seen when they were remembered.
_REMEMBERED: dict[str, tuple[tuple[int, int, int], dict[str, str]]] = {}


def remember_digests(path: Path, digests: dict[str, str]) -> None:
    """Keep `digests` ("xxh3_128", and SAMPLED for a file over SMALL_FILE_BYTES) of the closed file
    at `path` for `describe_files`."""
    st = path.stat()
    _REMEMBERED[os.path.abspath(path)] = ((st.st_ino, st.st_size, st.st_mtime_ns), dict(digests))


def _remembered(path: Path, st: os.stat_result) -> dict[str, str]:
    seen, digests = _REMEMBERED.pop(os.path.abspath(path), (None, {}))
    return digests if seen == (st.st_ino, st.st_size, st.st_mtime_ns) else {}


# What every reuse reads: a file up to SMALL_FILE_BYTES (manifests, JSON, indexes, sample-index
# metadata, small stores) is hashed whole; a larger one is checked by size and by the digest of
# SAMPLE_BLOCKS blocks of SAMPLE_BLOCK_BYTES at fixed offsets (first, last, evenly spaced): 64 KiB
# a file, whatever its size. Same-size damage inside a large file but outside its blocks is found
# only by `moai cache verify` (every byte). The cost is measured in docs/cache.md.
SMALL_FILE_BYTES = 1 << 20
SAMPLE_BLOCKS = 16
SAMPLE_BLOCK_BYTES = 4096
SAMPLED = "xxh3_128_sampled"
MANIFEST_DIGEST = "_manifest.xxh3"  # beside the manifest: the xxh3-128 of its bytes (none: an older moai)


def sampled_digest(path: Path, size: int) -> str:
    """xxh3-128 of SAMPLE_BLOCKS blocks at fixed offsets spread over the file (first and last included)."""
    import xxhash

    h = xxhash.xxh3_128()
    last = max(0, size - SAMPLE_BLOCK_BYTES)
    offsets = sorted({last * i // (SAMPLE_BLOCKS - 1) for i in range(SAMPLE_BLOCKS)})
    with open(path, "rb") as f:
        for offset in offsets:
            f.seek(offset)
            h.update(f.read(SAMPLE_BLOCK_BYTES))
    return h.hexdigest()


def manifest_digest(data: bytes) -> str:
    """What MANIFEST_DIGEST holds: the xxh3-128 of the manifest's bytes. A file of its own, so no
    same-size edit of the manifest (a renamed key included) can make it look like an older one."""
    import xxhash

    return xxhash.xxh3_128(data).hexdigest()


def content_problems(path: Path, files: dict[str, dict[str, Any]] | None) -> list[str]:
    """What every reuse can afford to read: small files hashed whole, large ones by their sampled
    blocks (a manifest from an older moai without them: whole files up to SMALL_FILE_BYTES only)."""
    problems = []
    for rel, rec in (files or {}).items():
        size = rec["bytes"]
        try:
            if size <= SMALL_FILE_BYTES:
                same = file_digest(path / rel) == rec["xxh3_128"]
            elif SAMPLED in rec:
                same = sampled_digest(path / rel, size) == rec[SAMPLED]
            else:
                continue
        except OSError as err:
            problems.append(f"{rel} cannot be read ({err.strerror})")
            continue
        if not same:
            problems.append(f"{rel} has changed since it was built (its bytes differ from its manifest's digest)")
    return problems


def file_digest(path: Path, chunk_bytes: int = 1 << 22) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def relative_files(folder: Path) -> list[str]:
    """Relative POSIX paths of the files under `folder`, sorted, its manifest and the manifest's
    digest left out."""
    out = []
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            full = Path(dirpath) / name
            if full.is_file():
                out.append(full.relative_to(folder).as_posix())
    return sorted(rel for rel in out if rel not in (MANIFEST, MANIFEST_DIGEST))


def load_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a published folder; `CacheError` if it cannot be read or is malformed."""
    manifest = read_manifest(path)
    if isinstance(manifest, str):
        raise CacheError.damaged(path, manifest)
    return manifest


def read_manifest(path: Path) -> dict[str, Any] | str:
    """The manifest, or what is wrong with it."""
    file = path / MANIFEST
    try:
        raw = file.read_bytes()
        text = raw.decode("utf-8")
    except FileNotFoundError:
        return f"it has no {MANIFEST}"
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
    try:
        recorded = (path / MANIFEST_DIGEST).read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        recorded = None  # an older moai's entry
    except OSError as err:
        return f"its {MANIFEST_DIGEST} cannot be read ({type(err).__name__}: {err})"
    if recorded is not None and recorded != manifest_digest(raw):
        return f"its {MANIFEST} has changed since it was written (it no longer matches {MANIFEST_DIGEST})"
    if not isinstance(manifest.get("report"), dict):
        return f"its {MANIFEST} has no 'report' (the stage's counts)"
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
    return [problem for rel, rec in (files or {}).items() if (problem := size_problem(path, rel, rec))]


def size_problem(path: Path, rel: str, rec: dict[str, Any]) -> str | None:
    try:
        size = (path / rel).stat().st_size
    except FileNotFoundError:
        return f"{rel} is missing"
    except OSError as err:
        return f"{rel} cannot be read ({err.strerror})"
    return None if size == rec["bytes"] else f"{rel} has {size} bytes, its manifest says {rec['bytes']}"


def first_problem(problems: list[str]) -> str:
    """One line for many problems: the first, and how many more."""
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


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
