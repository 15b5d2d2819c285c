"""Remote objects read ahead: the next objects' bytes fetched by threads while the current one is parsed.

convert parses one file at a time, in order, so its rows, origins and output are those of a
sequential read whatever happens here. With `source.num_parallel_reads` N > 1, the stored bytes of
up to N remote objects (the one being parsed and the next N - 1) are fetched at once by N
threads, one object each, in reads of `CHUNK_BYTES` (one ranged request each) into a queue of one chunk:
an object in flight holds at most three chunks (one queued, one being fetched, one being parsed),
so memory stays under N x 12 MiB plus the parser's buffers, whatever the objects' sizes. The
parser takes the chunks through `HashingReader`, so what is hashed is what is parsed; a fetch that
fails is raised when the parser reaches that object, named by its URL, as a sequential read raises it.

The threads wait on the network (the client library releases the GIL there), so they overlap
each object's request latency and transfer with the parsing of the one before. Local files and
parquet objects (read by random access) are read by the parser as before; N = 1 reads every object
in the parser's thread, one after another.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor

from moai.remote import RemoteObject
from moai.stages.convert.chunks import QueuedChunks
from moai.stages.convert.compressed import SourceFile, format_suffix
from moai.stages.convert.fingerprint import CHUNK_BYTES

_PUT_WAIT_S = 0.1  # how often a fetcher whose queue is full checks whether it was stopped


class Fetched(QueuedChunks):
    """One remote object's bytes, front to back, as a read-ahead thread fetches them."""

    def __init__(self, obj: RemoteObject, pool: ThreadPoolExecutor):
        super().__init__()
        self._queue: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        pool.submit(self._fetch, obj)

    def _fetch(self, obj: RemoteObject) -> None:
        try:
            with obj.open("rb") as f:
                while not self._stop.is_set():
                    chunk = f.read(CHUNK_BYTES)
                    self._put(chunk)
                    if not chunk:
                        return
        except BaseException as err:  # raised in the parser's thread when it reaches this object
            self._put(err)

    def _put(self, item: bytes | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_PUT_WAIT_S)
                return
            except queue.Full:
                continue

    def _next_chunk(self) -> memoryview:
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return memoryview(item)

    def close(self) -> None:
        """Stops the fetcher (it ends after the request in progress, if any) and drops what it holds."""
        self._stop.set()
        while not self._queue.empty():
            self._queue.get_nowait()
        super().close()


class ReadAhead:
    """Fetches the objects of `files` ahead of the parser, `num_parallel` at a time (the one being
    parsed included). `stream(i)` is called when the parser reaches file i, in order."""

    def __init__(self, files: list[SourceFile], num_parallel: int):
        self._files = files
        self._num = num_parallel
        self._started: dict[int, Fetched] = {}
        # threads kept for the whole read (starting one per object cost ~3 ms each on a loaded
        # machine, waiting for the GIL); tasks run in the order objects are reached, so the object
        # being parsed is never queued behind the ones after it
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        for fetched in self._started.values():
            fetched.close()
        self._started.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)  # a request in progress ends on its own
            self._pool = None

    @property
    def in_flight(self) -> int:
        """Objects being fetched (or fetched and not yet read to the end)."""
        return len(self._started)

    def _fetchable(self, i: int) -> bool:
        f = self._files[i]
        return isinstance(f, RemoteObject) and format_suffix(f) != ".parquet"

    def stream(self, i: int) -> Fetched | None:
        """File i's bytes, fetched ahead (None: the parser reads the file itself); starts fetching
        the fetchable files among the next `num_parallel - 1`."""
        if self._num <= 1:
            return None
        for done in [j for j in self._started if j < i]:  # read by now, and closed by their reader
            self._started.pop(done).close()
        for j in range(i, min(i + self._num, len(self._files))):
            if j not in self._started and self._fetchable(j):
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._num, thread_name_prefix="moai-fetch")
                self._started[j] = Fetched(self._files[j], self._pool)  # type: ignore[arg-type]
        return self._started.get(i)
