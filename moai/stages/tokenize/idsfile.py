"""A part's ids file (`.bin`), written past the page cache where the filesystem allows it.

The ids are most of what the tokenize stage writes (4 bytes a token for a vocabulary over 65,536:
~550 MB for 565 MB of text). Through the page cache each of their pages is new memory the kernel
must find, and on a VM that hands free memory back to its host (free page reporting, as on the
2-core machines moai is measured on) a page that has been free for a few seconds costs ~10× to
touch again: the writer then took 1.0-1.2 CPU-s for 550 MB of ids instead of 0.2-0.3, on cores
the encoder needs (docs/performance.md). So the ids go through one reused 8 MiB buffer aligned for
`O_DIRECT` straight to the disk, and the tail (under one 4 KiB block) through the page cache. The
ids do not push the user's other files out of the page cache either, and the kernel has no dirty
pages of them to write back after the stage.

- The disk must keep up (`Pace`): once 16 MiB went direct, a disk that takes them less than twice
  as fast as the ids arrive (network storage; many cores) sends the rest through the page cache,
  which does not wait for the disk. Held to 100 MB/s (a cgroup's blkio throttle), the stage
  switched after 23 MB and took 1.76-1.91 s against 1.79-2.16 s unthrottled (550 MB of ids).
- The bytes are hashed as they are written (the store's xxh3-128 and its sampled blocks, taken at
  `close`), and `moai.store.remember_digests` hands them to publishing, so it does not read 550 MB
  back from the disk.
- Where `O_DIRECT` is not there (macOS), the open is refused (tmpfs before Linux 6.6, some FUSE
  filesystems) or a write is refused (`EINVAL`: an alignment this filesystem does not take), the
  file goes on through the page cache from where it was: same bytes either way.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import time
from pathlib import Path

from moai import store

ALIGN = 4096  # O_DIRECT offsets, lengths and memory: a multiple of the logical block size
BUFFER_BYTES = 8 << 20
DIRECT = getattr(os, "O_DIRECT", 0)


class Pace:
    """Whether the disk keeps up with the ids: direct writes go on while the disk takes them at least
    twice as fast as the ids arrive (measured once MIN_BYTES went direct). A slower disk (network
    storage, or many cores' ids) would hold the encoder back; the page cache does not wait for it."""

    MIN_BYTES = 16 << 20
    FACTOR = 2.0

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.arrived = 0  # bytes of ids given to the writer
        self.disk_bytes = 0  # bytes written direct, and the seconds the writes took
        self.disk_seconds = 0.0
        self.direct = True

    def keeps_up(self, arrived: int) -> bool:
        """Count `arrived` bytes; False from the first time the disk is measured behind on."""
        self.arrived += arrived
        if self.direct and self.disk_bytes >= self.MIN_BYTES and self.disk_seconds > 0:
            need = self.arrived / max(time.perf_counter() - self.started, 1e-9)
            self.direct = self.disk_bytes / self.disk_seconds >= self.FACTOR * need
        return self.direct


class IdsFile:
    """Write bytes to `path` (O_DIRECT where possible), hashing them; `close` gives the digests."""

    def __init__(self, path: Path, buffer: mmap.mmap | None, pace: Pace | None = None):
        """`buffer`: BUFFER_BYTES of page-aligned memory (`new_buffer`), reused file after file by
        one writer; None writes through the page cache. `pace` is told how long direct writes take."""
        import xxhash

        self.path = path
        self.pace = pace
        self.hash = xxhash.xxh3_128()
        self.size = 0  # bytes given
        self.buffer = buffer
        self.fill = 0  # bytes of the buffer not yet written
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self.direct = bool(DIRECT) and buffer is not None
        if self.direct:
            try:
                self.fd = os.open(path, flags | DIRECT, 0o644)
                return
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self.direct = False
        self.fd = os.open(path, flags, 0o644)

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        self.hash.update(view)
        self.size += len(view)
        while len(view) and self.direct:
            assert self.buffer is not None
            n = min(len(view), BUFFER_BYTES - self.fill)
            self.buffer[self.fill : self.fill + n] = view[:n]
            self.fill += n
            view = view[n:]
            if self.fill == BUFFER_BYTES:
                self._flush(BUFFER_BYTES)
        if len(view):  # through the page cache, after what the buffer still holds
            if self.fill:
                self._flush(self.fill)
            _write_all(self.fd, view)

    def _flush(self, n: int) -> None:
        """Write the buffer's first n bytes (a multiple of ALIGN while direct); keep the rest."""
        assert self.buffer is not None
        out, done, started, direct = memoryview(self.buffer)[:n], 0, time.perf_counter(), self.direct
        try:
            while done < n:
                try:
                    done += os.write(self.fd, out[done:])
                except OSError as err:
                    if not self.direct or err.errno != errno.EINVAL:
                        raise
                    self._buffered()  # this filesystem takes the open but not the write: the page cache
        finally:
            out.release()
        if direct and self.direct and self.pace is not None:
            self.pace.disk_bytes += n
            self.pace.disk_seconds += time.perf_counter() - started
        rest = self.fill - n
        if rest:
            self.buffer[:rest] = self.buffer[n : self.fill]
        self.fill = rest

    def to_page_cache(self) -> None:
        """Write the rest through the page cache (the disk is behind: it does not wait for it)."""
        if self.direct:
            self._buffered()
            if self.fill:
                self._flush(self.fill)

    def _buffered(self) -> None:
        """Go on through the page cache, at the same offset."""
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~DIRECT)
        self.direct = False

    def close(self) -> dict[str, str]:
        """Write what is left and close; the store's digests of the file (`remember_digests`)."""
        try:
            if self.fill:
                whole = self.fill - self.fill % ALIGN
                if whole and self.direct:
                    self._flush(whole)
                if self.direct:
                    self._buffered()  # the tail is not a whole block
                self._flush(self.fill)
        finally:
            self.abandon()  # closed, whatever the flush did
        digests = {"xxh3_128": self.hash.hexdigest()}
        if self.size > store.SMALL_FILE_BYTES:
            digests[store.SAMPLED] = store.sampled_digest(self.path, self.size)
        return digests

    def abandon(self) -> None:
        """Close without writing what is left (a write failed: the file is not published)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def new_buffer() -> mmap.mmap:
    """Page-aligned memory for an `IdsFile` (anonymous map: aligned to the page)."""
    return mmap.mmap(-1, BUFFER_BYTES)


_SPARE: list[mmap.mmap] = []  # buffers given back, for the next writer of this process


def take_buffer() -> mmap.mmap:
    """A buffer for one writer's files (its pages already touched when it was used before); give it
    back when that writer is done (`give_back`). Writers running at once each get their own."""
    try:
        return _SPARE.pop()
    except IndexError:
        return new_buffer()


def give_back(buffer: mmap.mmap) -> None:
    _SPARE.append(buffer)


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        n = os.write(fd, data)
        data = data[n:]
