"""Looking after a cache folder: `verify_cache` (every byte against the manifests, `moai cache
verify`), `scan` (what is there, `moai cache list`) and `prune` (`moai cache prune`).

What a stage folder `<cache_dir>/<stage>/` holds:

- `<key>/`: a published entry, with its `_manifest.json`. A folder named like a key without a
  readable manifest is a damaged entry (the store never publishes one);
- `.<key>.lock`: the lock a builder of `key` holds (`fcntl.flock`, 0 bytes). The builder removes
  it before letting go, whether the build published, failed or was interrupted; only a builder
  killed with SIGKILL leaves one: a stray lock, harmless (the kernel freed its lock when the
  process died, so it blocks nobody) and removed by `moai cache prune`;
- `.tmp-<key>-<pid>-<hex>`: a build in progress (its key's lock is held), or a leftover of a builder
  that died; `.trash-<key>-<pid>-<hex>`: an entry being removed, or left by a prune that died;
- `.uses.jsonl`: one line per reuse or build (`Store._used`): when, and for which config.

Anything else (a training run's `runs/` folder) is not the store's, and is neither listed nor
touched.

`prune` never removes what a running build writes: it removes a `.tmp-*`, an entry or a lock file
only while it holds that key's lock itself, taken without waiting; a held lock means a build is
running, and the item is skipped as in use. A builder that starts meanwhile waits for the lock,
then builds afresh. An entry is first renamed to `.trash-*` (one rename: it stops being published
at once), then deleted, so a prune killed half-way leaves a `.trash-*` (the next prune removes
it), never a half-deleted folder that looks published. A lock file is unlinked while held:
filelock 4 (installed) notices that the file it locked was unlinked and locks the new one (an
older filelock may, in that instant, let two processes build the same key; the second rename
fails, and a rerun reuses). Not guarded: a process *reading* an entry (training reading its
sample index) holds no lock, so keep what running jobs need (`--keep CONFIG`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moai.errors import CacheError, ConfigError
from moai.store import (
    FILES,
    MANIFEST,
    USES,
    file_digest,
    first_problem,
    lock_error,
    lock_path,
    read_manifest,
    relative_files,
    size_problem,
    tree_bytes,
)

KEY = r"[0-9a-f]{20}(?:-[^/]+-\d{5})?"  # a stage key, or a tokenize part's `<key>-<split>-<index>`
KEY_RE = re.compile(KEY)
LOCK_RE = re.compile(rf"\.(?P<key>{KEY})\.lock")
LEFTOVER_RE = re.compile(rf"\.(?:tmp|trash)-(?P<key>{KEY}|.+?)-\d+-[0-9a-f]{{8}}")

# -- verify ----------------------------------------------------------------------------------------

OK, DAMAGED, UNVERIFIABLE = "ok", "damaged", "unverifiable"


@dataclass(frozen=True)
class EntryCheck:
    """The verdict on one published folder (or lock file) of a cache, and a one-line message saying why."""

    stage: str
    key: str
    path: Path
    status: str  # OK, DAMAGED or UNVERIFIABLE
    problems: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        if self.status == DAMAGED and self.path.name.endswith(".lock"):
            return str(lock_error(self.path, OSError(0, self.problems[0])))
        if self.status == DAMAGED:
            return str(CacheError.damaged(self.path, first_problem(list(self.problems))))
        if self.status == UNVERIFIABLE:
            return (
                f"cache entry {self.path} is unverifiable: its {MANIFEST} has no file list (written by an older "
                "moai); if in doubt remove the folder: it will be rebuilt when needed"
            )
        return f"cache entry {self.path} is ok"


def verify_cache(root: str | os.PathLike) -> Iterator[EntryCheck]:
    """Check every entry `<root>/<stage>/<key>/`, in sorted order: sizes and digests of the recorded
    files, and files nobody recorded. A folder named like a key without a readable manifest is
    damaged; a lock file a builder could not open is named too. Builds in progress and leftovers
    are not published and are skipped; a folder neither named like a key nor with a manifest is
    not the store's (a training run's output, say) and is skipped too."""
    root = Path(root)
    if not root.is_dir():
        raise CacheError(f"{root} is not a folder: no cache to verify (give the cache_dir of a config)")
    for stage_dir in _visible_dirs(root):
        for path in sorted(stage_dir.iterdir()):
            if path.is_dir() and not path.name.startswith(".") and _is_entry(path):
                yield check_entry(path)
            elif LOCK_RE.fullmatch(path.name) and (problem := _lock_problem(path)):
                yield EntryCheck(stage_dir.name, path.name[1:-5], path, DAMAGED, (problem,))


def check_entry(path: Path) -> EntryCheck:
    """The verdict on one published folder (see `verify_cache`)."""
    stage, key = path.parent.name, path.name
    manifest = read_manifest(path)
    if isinstance(manifest, str):
        return EntryCheck(stage, key, path, DAMAGED, (manifest,))
    files = manifest.get(FILES)
    if files is None:
        return EntryCheck(stage, key, path, UNVERIFIABLE)
    problems = content_problems(path, files)
    return EntryCheck(stage, key, path, DAMAGED if problems else OK, tuple(problems))


def content_problems(path: Path, files: dict[str, dict[str, Any]]) -> list[str]:
    """Sizes, then the digest of every file of the right size, then files nobody recorded."""
    problems = []
    for rel, rec in files.items():
        problem = size_problem(path, rel, rec)
        if problem is None:
            try:
                if file_digest(path / rel) != rec["xxh3_128"]:
                    problem = f"{rel} has other content than its manifest records (xxh3-128 differs)"
            except OSError as err:
                problem = f"{rel} cannot be read ({err.strerror})"
        if problem:
            problems.append(problem)
    problems += [f"{rel} is not in its manifest" for rel in relative_files(path) if rel not in files]
    return problems


def _is_entry(path: Path) -> bool:
    return (path / MANIFEST).is_file() or KEY_RE.fullmatch(path.name) is not None


def _lock_problem(lock: Path) -> str | None:
    """Why a builder could not open this lock file (as filelock does: read and write), or None."""
    try:
        os.close(os.open(lock, os.O_RDWR))
    except OSError as err:
        return err.strerror or str(err)
    return None


def _visible_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


# -- list ------------------------------------------------------------------------------------------

ENTRY, DAMAGED_ENTRY, LEFTOVER, STRAY_LOCK = "entry", "damaged", "leftover", "stray lock"


@dataclass(frozen=True)
class Item:
    """One thing in a cache folder (see the module docstring)."""

    kind: str  # ENTRY, DAMAGED_ENTRY, LEFTOVER or STRAY_LOCK
    stage: str
    key: str
    path: Path
    size: int  # bytes
    last_used: float  # epoch seconds: last reuse or build from the use log, else the build time, else mtime
    configs: tuple[str, ...] = ()  # configs that used it (use log), the most recent last
    in_use: bool = False  # its key's lock is held: a build is running


def scan(root: str | os.PathLike) -> list[Item]:
    """Every entry, leftover and stray lock of a cache folder, by stage then name."""
    root = Path(root)
    if not root.is_dir():
        raise CacheError(f"{root} is not a folder: no cache here (give a cache folder or the config that uses it)")
    items = []
    for stage_dir in _visible_dirs(root):
        uses = read_uses(stage_dir)
        names = {p.name for p in stage_dir.iterdir()}
        for path in sorted(stage_dir.iterdir()):
            item = _item(path, uses, names)
            if item is not None:
                items.append(item)
    return items


def _item(path: Path, uses: dict[str, tuple[float, list[str]]], names: set[str]) -> Item | None:
    stage_dir, name = path.parent, path.name
    if path.is_dir() and (m := LEFTOVER_RE.fullmatch(name)):
        key = m["key"]
        return Item(LEFTOVER, stage_dir.name, key, path, tree_bytes(path), _mtime(path), (), _held(stage_dir, key))
    if path.is_dir() and not name.startswith(".") and _is_entry(path):
        manifest = read_manifest(path)
        at, configs = uses.get(name, (None, []))
        if at is None:
            at = _built_at(manifest) if isinstance(manifest, dict) else None
        kind = ENTRY if isinstance(manifest, dict) else DAMAGED_ENTRY
        size, last = tree_bytes(path), at or _mtime(path)
        return Item(kind, stage_dir.name, name, path, size, last, tuple(configs), _held(stage_dir, name))
    if path.is_file() and (m := LOCK_RE.fullmatch(name)):
        key = m["key"]
        if key in names or any(_leftover_key(n) == key for n in names):
            return None  # the lock of an entry or of a build: part of it
        return Item(STRAY_LOCK, stage_dir.name, key, path, 0, _mtime(path), (), _held(stage_dir, key))
    return None


def read_uses(stage_dir: Path) -> dict[str, tuple[float, list[str]]]:
    """key -> (last use, configs that used it, the most recent last), from the stage's use log."""
    out: dict[str, tuple[float, list[str]]] = {}
    try:
        lines = (stage_dir / USES).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            use = json.loads(line)
            key, at, config = use["key"], float(use["at"]), use.get("config")
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a crash: the others still count
        last, configs = out.get(key, (0.0, []))
        if config:
            configs = [c for c in configs if c != config] + [config]
        out[key] = (max(last, at), configs)
    return out


def _built_at(manifest: dict[str, Any]) -> float | None:
    try:
        return time.mktime(time.strptime(str(manifest.get("built_at")), "%Y-%m-%dT%H:%M:%S%z"))
    except ValueError:
        return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def _held(stage_dir: Path, key: str) -> bool:
    """Whether a build of `key` holds its lock now (checked without creating a lock file)."""
    try:
        fd = os.open(lock_path(stage_dir, key), os.O_RDONLY)
    except FileNotFoundError:
        return False  # a builder creates the lock before anything else
    except OSError:
        return True  # cannot tell: count it as in use, so prune leaves it alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our lock too
    return False


# -- prune -----------------------------------------------------------------------------------------


@dataclass
class Pruned:
    removed: list[Item] = field(default_factory=list)
    skipped: list[tuple[Item, str]] = field(default_factory=list)  # (item, why it stays)

    @property
    def freed(self) -> int:
        return sum(i.size for i in self.removed)


def needed_keys(config) -> set[str]:
    """The keys of every stage output `config` needs, computed without building anything (the
    roots fingerprint its source files and tokenizer, which reads them)."""
    from moai.pipeline import StageResult, key_of, walk

    def key_only(name: str, inputs: dict[str, Any]) -> StageResult:
        return StageResult(name, key_of(config, name, inputs), "", {}, False)

    return {r.key for r in walk(config, key_only).values()}


def prune(
    root: str | os.PathLike,
    *,
    keep: set[str] | None = None,
    older_than_s: float | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> Pruned:
    """Remove leftovers and stray locks, and, when asked, entries: those whose key is not in `keep`
    and/or that were last used more than `older_than_s` ago (both, when both are given). Never an
    item whose key's lock is held (see the module docstring)."""
    now = time.time() if now is None else now
    out = Pruned()
    for item in scan(root):
        if item.kind in (ENTRY, DAMAGED_ENTRY):
            if keep is None and older_than_s is None:
                continue
            if keep is not None and item.key.split("-", 1)[0] in keep:
                continue  # a tokenize part goes with its token store's key
            if older_than_s is not None and now - item.last_used <= older_than_s:
                continue
        if dry_run:
            if item.in_use:
                out.skipped.append((item, "in use by a running build"))
            else:
                out.removed.append(item)
            continue
        with _key_lock(item.path.parent, item.key) as held:
            if not held:
                out.skipped.append((item, "in use by a running build"))
                continue
            try:
                _remove(item)
            except OSError as err:
                out.skipped.append((item, f"cannot remove it ({err.strerror})"))
                continue
        out.removed.append(item)
    return out


def _remove(item: Item) -> None:
    """Remove an item while holding its key's lock; its lock file goes too once nothing of the key is left."""
    stage_dir = item.path.parent
    if item.kind in (ENTRY, DAMAGED_ENTRY):
        trash = stage_dir / f".trash-{item.key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(item.path, trash)  # unpublished at once; a crash from here on leaves a leftover
        shutil.rmtree(trash)
    elif item.kind == LEFTOVER:
        shutil.rmtree(item.path)
    rest = [p for p in stage_dir.iterdir() if p.name == item.key or _leftover_key(p.name) == item.key]
    if not rest:
        lock_path(stage_dir, item.key).unlink(missing_ok=True)


def _leftover_key(name: str) -> str | None:
    m = LEFTOVER_RE.fullmatch(name)
    return m["key"] if m else None


@contextmanager
def _key_lock(stage_dir: Path, key: str) -> Iterator[bool]:
    """Hold `key`'s build lock while the block runs, if it is free now: yields whether it is held."""
    try:
        fd = os.open(lock_path(stage_dir, key), os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """`30d`, `12h`, `90m`, `2w`, `45s` -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not m:
        raise ConfigError(f"--older-than {text!r}: give a number and a unit (s, m, h, d, w), e.g. 30d or 12h")
    return float(m[1]) * UNITS[m[2]]


def format_age(seconds: float) -> str:
    for unit, size in (("w", UNITS["w"]), ("d", UNITS["d"]), ("h", UNITS["h"]), ("m", UNITS["m"])):
        if seconds >= 2 * size or (unit == "m" and seconds >= size):
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


# -- what the CLI prints ---------------------------------------------------------------------------


def list_lines(items: list[Item], now: float | None = None) -> list[str]:
    """`moai cache list`: a row per item, then one summary line."""
    from moai.store import human_bytes

    now = time.time() if now is None else now
    rows = [("STAGE", "NAME", "KIND", "SIZE", "AGE", "IN USE", "CONFIG")]
    for i in items:
        config = "-" if not i.configs else i.configs[-1] + (f" (+{len(i.configs) - 1} more)" * (len(i.configs) > 1))
        name = i.key if i.kind in (ENTRY, DAMAGED_ENTRY) else i.path.name
        age = format_age(now - i.last_used)
        rows.append((i.stage, name, i.kind, human_bytes(i.size), age, "yes" if i.in_use else "-", config))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows]

    def count(kinds: tuple[str, ...], noun: str) -> str:
        chosen = [i for i in items if i.kind in kinds]
        return f"{len(chosen)} {noun} ({human_bytes(sum(i.size for i in chosen))})"

    in_use = sum(i.in_use for i in items)
    return [
        *(lines if items else []),
        f"{count((ENTRY, DAMAGED_ENTRY), 'entries')}, {count((LEFTOVER,), 'leftovers')}, "
        f"{sum(i.kind == STRAY_LOCK for i in items)} stray locks; {in_use} in use by a running build",
    ]


def prune_lines(pruned: Pruned, dry_run: bool) -> list[str]:
    """`moai cache prune`: a line per item removed (or kept because in use), then the summary."""
    from moai.store import human_bytes

    verb = "would remove" if dry_run else "removed"
    out = [f"{verb} {i.stage}/{i.path.name} ({i.kind}, {human_bytes(i.size)})" for i in pruned.removed]
    out += [f"kept {i.stage}/{i.path.name} ({i.kind}): {why}" for i, why in pruned.skipped]
    n, gb = len(pruned.removed), pruned.freed / 1e9
    summary = (
        f"{n} entries would be removed, {gb:.2f} GB would be freed (dry run)"
        if dry_run
        else f"{n} entries removed, {gb:.2f} GB freed"
    )
    return [*out, summary + (f"; {len(pruned.skipped)} kept" if pruned.skipped else "")]
