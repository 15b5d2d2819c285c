"""A remote cache that machines share: published store folders mirrored under an fsspec URL.

`remote_cache: s3://bucket/prefix` (any fsspec URL; `remote_cache_options` are its storage
options, credentials from the environment as for sources). The local store stays the one that
stages read; the remote holds copies of its published folders at `<url>/<stage>/<key>/`:

- push (after a stage publishes locally, and when a local entry is reused and the remote lacks
  it): the data files first, the manifest last. A remote folder without a manifest does not exist,
  so an upload cut by a dead server or machine leaves nothing another machine would take.
- pull (on a local miss, before building): the manifest, then every file it lists into a hidden
  folder of the local store; each file's size and xxh3-128 are checked against the manifest
  before the folder is published by the store's own atomic rename, so a corrupted remote object
  is refused (`CacheError`, naming the object and the fix) and never reaches a stage.

Builds are deterministic, so two machines that build the same key upload the same data files;
only the manifest's timings differ, and the last manifest written wins. The per-part stages
(`tokenize-parts`, `signatures-parts`) are not mirrored: the token store a part goes into is.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moai.errors import CacheError, MoaiError
from moai.remote import bucket_of, explain, filesystem, tool_command

log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"
NOT_MIRRORED = ("tokenize-parts", "signatures-parts")
OPTIONS = "remote_cache_options"  # the setting an error's fix names


@dataclass(frozen=True)
class RemoteEntry:
    stage: str
    key: str
    url: str


_CHECKED: set[str] = set()  # remote caches this process has found reachable (one request, not one a stage)


class RemoteCache:
    def __init__(self, url: str, storage_options: dict[str, Any] | None = None):
        self.url = url.rstrip("/")
        self.fs = filesystem(self.url, storage_options)

    def check(self, write: bool = False) -> None:
        """Reachable, credentials accepted, bucket there (and, with `write`, writable): else one
        `MoaiError` line in seconds naming the URL and the fix."""
        if self.url in _CHECKED and not write:
            return
        protocol, bucket = self.url.split("://", 1)[0], bucket_of(self.url)
        try:
            self.fs.info(f"{protocol}://{bucket}")
            if write:
                probe = f"{self.url}/.moai-write-probe-{uuid.uuid4().hex[:8]}"
                self.fs.pipe_file(probe, b"probe")
                self.fs.rm_file(probe)
        except FileNotFoundError:
            raise MoaiError(
                f"remote_cache {self.url}: the bucket {bucket} does not exist: create it "
                f"({tool_command(self.url, 'mb')}) or fix remote_cache"
            ) from None
        except Exception as err:
            raise explain(self.url, err, "write" if write else "read", OPTIONS) from None
        _CHECKED.add(self.url)

    def entry_url(self, stage: str, key: str) -> str:
        return f"{self.url}/{stage}/{key}"

    def mirrors(self, stage: str) -> bool:
        return stage not in NOT_MIRRORED

    def has(self, stage: str, key: str) -> bool:
        """Whether the remote holds (stage, key): its manifest is there (it is uploaded last)."""
        self.check()
        url = f"{self.entry_url(stage, key)}/{MANIFEST}"
        try:
            self.fs.info(url)
        except FileNotFoundError:
            return False
        except Exception as err:
            raise explain(url, err, options=OPTIONS) from None
        return True

    def push(self, folder: Path, stage: str, key: str) -> bool:
        """Upload a published folder unless the remote has it: data files, then the manifest. True if uploaded."""
        if self.has(stage, key):
            return False
        from moai.store import FILES, load_manifest

        manifest = load_manifest(folder)
        base = self.entry_url(stage, key)
        target = base
        try:
            for rel in sorted(manifest.get(FILES) or {}):
                target = f"{base}/{rel}"
                self.fs.put_file(str(folder / rel), target)
            target = f"{base}/{MANIFEST}"
            self.fs.put_file(str(folder / MANIFEST), target)
        except Exception as err:
            line = explain(target, err, "write", OPTIONS)
            raise MoaiError(
                f"{line}; nothing of {stage} {key} is visible remotely (its manifest goes last) and the local "
                "store is intact: rerun (or `moai cache push`) once the remote is back"
            ) from None
        log.info("%s %s: uploaded to %s", stage, key, base)
        return True

    def pull(self, stage_dir: Path, stage: str, key: str) -> bool:
        """Download (stage, key) into `stage_dir/key` if the remote has it, every file checked
        against the manifest first; True if it is now published locally. The caller holds the key's lock."""
        if not self.has(stage, key):
            return False
        from moai.store import FILES, _fsync_dir, file_digest, read_manifest

        base = self.entry_url(stage, key)
        # named as a build in progress is (moai.store): `moai cache prune` knows it by its key lock
        tmp = stage_dir / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            target = f"{base}/{MANIFEST}"
            try:
                self.fs.get_file(target, str(tmp / MANIFEST))
                manifest = read_manifest(tmp)
                if isinstance(manifest, str):
                    raise CacheError(f"remote cache entry {base} is damaged: {manifest}; {_fix(base)}")
                files = manifest.get(FILES) or {}
                for rel in sorted(files):
                    target = f"{base}/{rel}"
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    self.fs.get_file(target, str(tmp / rel))
            except MoaiError:
                raise
            except Exception as err:
                raise explain(target, err, options=OPTIONS) from None
            for rel, rec in files.items():
                size, digest = (tmp / rel).stat().st_size, file_digest(tmp / rel)
                if size != rec["bytes"] or digest != rec["xxh3_128"]:
                    raise CacheError(
                        f"remote cache entry {base} is damaged: {rel} has {size} bytes and xxh3 {digest[:12]}…, "
                        f"its manifest says {rec['bytes']} bytes and {rec['xxh3_128'][:12]}…; {_fix(base)}"
                    )
            _fsync_dir(tmp)
            os.rename(tmp, stage_dir / key)
            _fsync_dir(stage_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("%s %s: pulled from %s", stage, key, base)
        return True

    def entries(self) -> list[RemoteEntry]:
        """Every entry the remote holds (a folder with its manifest), sorted by stage and key."""
        self.check()
        try:
            found = self.fs.glob(f"{self.url}/*/*/{MANIFEST}")
        except Exception as err:
            raise explain(self.url, err, options=OPTIONS) from None
        out = []
        for path in found:
            stage, key = path.rstrip("/").split("/")[-3:-1]
            out.append(RemoteEntry(stage, key, self.entry_url(stage, key)))
        return sorted(out, key=lambda e: (e.stage, e.key))

    def manifest(self, stage: str, key: str) -> dict[str, Any]:
        url = f"{self.entry_url(stage, key)}/{MANIFEST}"
        try:
            return json.loads(self.fs.cat_file(url))
        except Exception as err:
            raise explain(url, err, options=OPTIONS) from None


def _fix(base: str) -> str:
    return f"remove it (e.g. `{tool_command(base, 'rm')}`) and rerun: it will be rebuilt and uploaded again"


def remote_of(config: Any) -> RemoteCache | None:
    """The config's remote cache, or None when `remote_cache` is not set."""
    url = getattr(config, "remote_cache", None)
    return None if url is None else RemoteCache(url, config.remote_cache_options)


def push_all(root: Path, remote: RemoteCache) -> tuple[int, int]:
    """Upload every published entry of a local store that the remote lacks: (uploaded, already there)."""
    from moai.cache import ENTRY, scan

    uploaded = present = 0
    for item in scan(root):
        if item.kind == ENTRY and remote.mirrors(item.stage):
            if remote.push(item.path, item.stage, item.key):
                uploaded += 1
            else:
                present += 1
    return uploaded, present


def pull_all(root: Path, remote: RemoteCache, keys: set[str] | None = None) -> tuple[int, int]:
    """Download the remote's entries (those with a key in `keys`, or all) that the local store
    lacks, each under its key's lock as a build would take it: (pulled, already here)."""
    from filelock import FileLock

    from moai.store import lock_path

    pulled = present = 0
    for e in remote.entries():
        if not remote.mirrors(e.stage) or (keys is not None and e.key not in keys):
            continue
        stage_dir = root / e.stage
        if (stage_dir / e.key / MANIFEST).is_file():
            present += 1
            continue
        stage_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock_path(stage_dir, e.key))):
            if (stage_dir / e.key / MANIFEST).is_file():
                present += 1
            elif remote.pull(stage_dir, e.stage, e.key):
                pulled += 1
    return pulled, present
