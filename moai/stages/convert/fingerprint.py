"""How convert knows the bytes it read are the bytes its key describes.

A local source's fingerprint (the root of every key downstream) is, per file, its name, length
and xxh3-128, combined in file order (`files_fingerprint`). The same `Digest` hashes a file for
the fingerprint and, through `HashingReader`, while convert parses it; `check_read` refuses to
publish when the two differ, naming the file when this process took the fingerprint.
"""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Any, NamedTuple

from moai.config import SourceConfig
from moai.errors import DataError
from moai.remote import RemoteObject, explain

CHUNK_BYTES = 1 << 22


class Digest:
    """xxh3-128 and length of one file's bytes, fed in file order: the same code hashes a file for
    the fingerprint and while convert reads it, so the two can only differ if the bytes do. With
    `md5`, the MD5 too: what an S3 ETag of a single-part upload is, checked against the listing."""

    def __init__(self, md5: bool = False) -> None:
        import hashlib

        import xxhash

        self._hash = xxhash.xxh3_128()
        self.md5 = hashlib.md5(usedforsecurity=False) if md5 else None
        self.size = 0

    def update(self, chunk: bytes | memoryview) -> None:
        self._hash.update(chunk)
        if self.md5 is not None:
            self.md5.update(chunk)
        self.size += len(chunk)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def of(self, path: Path) -> FileRead:
        return FileRead(str(path), path.name, self.size, self._hash.hexdigest())


class FileRead(NamedTuple):
    path: str
    name: str
    size: int
    digest: str

    def content(self) -> tuple[str, int, str]:
        return self.name, self.size, self.digest


def files_fingerprint(files: list[FileRead]) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    for f in files:
        h.update(f"{f.name}\0{f.size}\0{f.digest}\0".encode())
    return f"files:{h.hexdigest()}"


def digest_file(path: Path) -> FileRead:
    digest = Digest()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.of(path)


# The per-file digests behind the fingerprints this process took (a few, newest last), so that
# convert can name the file that changed since; a fingerprint from another process has none here.
_TAKEN: dict[tuple[str | None, str], list[FileRead]] = {}
_TAKEN_LOCK = threading.Lock()  # Prefect may run tasks in threads


def remember(source_path: str | None, fingerprint: str, files: list[FileRead]) -> None:
    """Keep the per-file digests behind a fingerprint this process took (a few, newest last)."""
    with _TAKEN_LOCK:
        _TAKEN.pop((source_path, fingerprint), None)
        _TAKEN[(source_path, fingerprint)] = files
        while len(_TAKEN) > 8:
            del _TAKEN[next(iter(_TAKEN))]


class HashingReader(io.RawIOBase):
    """A file read once front to back, hashing its bytes as they pass: the digest is of exactly
    the bytes convert parsed, whatever happens to the file meanwhile."""

    def __init__(self, path: Path | RemoteObject, fetched: io.RawIOBase | None = None):
        """`fetched`: the remote object's bytes as a read-ahead thread fetches them (`read_ahead`)."""
        super().__init__()
        self._file: Any
        if isinstance(path, Path):
            self._file = open(path, "rb", buffering=0)  # noqa: SIM115 (the reader owns it: closed by close())
            self.digest = Digest()
            self._url: str | None = None
        else:
            self._url = path.url
            try:
                self._file = path.open("rb") if fetched is None else fetched
            except Exception as err:
                raise explain(path.url, err) from None
            self.digest = Digest(md5=path.md5() is not None)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        try:
            n = self._file.readinto(buffer)
        except Exception as err:
            if self._url is None:
                raise
            # a connection lost mid-object is the store's fault, named as such (not a corrupt file)
            raise explain(self._url, err) from None
        if n:
            self.digest.update(memoryview(buffer)[:n])
        return n

    def readall(self) -> bytes:
        chunks = []
        while chunk := self.read(CHUNK_BYTES):
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self._file.close()
        super().close()


def object_read(obj: RemoteObject, digest: Digest) -> FileRead:
    """What was read of a remote object, as its listing described it (the fingerprint is the
    listing's: size and ETag), once the bytes read are known to be that object's: as many bytes as
    listed, their MD5 the ETag when the ETag is an MD5, and otherwise the ETag unchanged after reading."""
    if obj.version is None:  # nothing in the listing to go by: the fingerprint hashed the bytes
        return FileRead(obj.url, obj.name, digest.size, digest.hexdigest())
    expected = obj.md5()
    same = digest.size == obj.size and (
        digest.md5.hexdigest() == expected if expected is not None and digest.md5 is not None else obj.current() == obj
    )
    if not same:
        raise DataError(changed_file(obj.url))
    return object_entry(obj)


def object_entry(obj: RemoteObject) -> FileRead:
    """A remote object's entry in the fingerprint: its listing's size and version (ETag); for a
    store whose listing gives no version (some https servers), a hash of its bytes, read once."""
    if obj.version is not None:
        return FileRead(obj.url, obj.name, obj.size, f"version:{obj.version}")
    with HashingReader(obj) as f:
        while f.read(CHUNK_BYTES):
            pass
    return FileRead(obj.url, obj.name, f.digest.size, f.digest.hexdigest())


def stat_of(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def changed_file(path: Path | str) -> str:
    return (
        f"source file {path} changed while convert was reading it (its content no longer matches the "
        "fingerprint taken at the start); nothing was published — rerun when the file is no longer being written"
    )


def check_read(source: SourceConfig, source_fp: str, read: list[FileRead]) -> None:
    """Refuse to publish unless the bytes convert read are the bytes `source_fp` fingerprinted:
    the store keys this output by `source_fp`, and a key must describe exactly what it holds."""
    if files_fingerprint(read) == source_fp:
        return
    with _TAKEN_LOCK:
        taken = _TAKEN.get((source.path, source_fp))
    if taken is not None and [f.path for f in taken] != [f.path for f in read]:
        new = sorted({f.path for f in read} - {f.path for f in taken})
        gone = sorted({f.path for f in taken} - {f.path for f in read})
        raise DataError(
            f"source.path {source.path!r} matched {len(taken)} file(s) at the start and {len(read)} when convert "
            f"read them (new: {new or 'none'}; gone: {gone or 'none'}); nothing was published — rerun when the "
            "files are no longer being written"
        )
    if taken is not None:
        changed = [now.path for now, then in zip(read, taken, strict=True) if now.content() != then.content()]
        raise DataError(changed_file(changed[0]))
    if len(read) == 1:
        raise DataError(changed_file(read[0].path))
    # The fingerprint came from another process: which file differs cannot be told, only that one does.
    raise DataError(
        f"source.path {source.path!r}: one of its {len(read)} files changed while convert was reading them "
        "(their content no longer matches the fingerprint taken at the start); nothing was published — rerun "
        "when the files are no longer being written"
    )
