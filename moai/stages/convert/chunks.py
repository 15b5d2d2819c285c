"""Bytes that another thread hands over in chunks, read front to back as a file."""

from __future__ import annotations

import io
from typing import Any


class QueuedChunks(io.RawIOBase):
    """A readable stream of the chunks `_next_chunk` gives, in order; its error is raised by the
    read that reaches it, and every read after the end or an error gives nothing."""

    def __init__(self) -> None:
        super().__init__()
        self._view = memoryview(b"")
        self._ended = False

    def _next_chunk(self) -> memoryview:
        """The next chunk (empty at the end), waiting for the thread that makes it."""
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._view:
            if self._ended:
                return 0
            try:
                self._view = self._next_chunk()
            except BaseException:
                self._ended = True
                raise
            if not self._view:
                self._ended = True
                return 0
        n = min(len(buffer), len(self._view))
        buffer[:n] = self._view[:n]
        self._view = self._view[n:]
        return n

    def close(self) -> None:
        self._view = memoryview(b"")
        super().close()
