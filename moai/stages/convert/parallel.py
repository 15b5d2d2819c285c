"""JSON lines parsed on several cores.

convert's own thread still reads every byte of a JSON-lines file through the hashing reader (and
the decompressor, for a compressed one), so what is parsed is what is hashed. It cuts the stream
after a line end into pieces of `PIECE_BYTES` and hands them to worker processes, which do what
one thread did line by line: decode, parse, the text of the row (`text_field`, `text_template`,
chat messages), the Unicode check, the bad-row routing. Each piece comes back as a record batch
of texts and origins with its row counts, in file order, and `Rebatcher` writes the batches as a
single thread would have cut them (`writer_batch_size` rows each): the dataset is byte for byte
the one a sequential read writes, whatever the number of workers (tests/stages/test_convert_parallel.py).

Bad rows: a worker counts what it skips and keeps the first few messages of each reason; with
`on_bad_rows: error` it stops at its piece's first bad row. convert replays those through its
own `Rows` in file order, so the counts, the logged warnings, the "which setting to change" fix and
the error for the first bad row are what a sequential read gives.

Measured in benchmarks/prepare_e2e.py and benchmarks/many_cores.sh (docs/performance.md).
"""

from __future__ import annotations

import collections
import io
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from moai.config import SourceConfig
from moai.formats.text import text_batch
from moai.stages.convert.readers import Rows
from moai.workers import spawn_pool

# Bytes of a piece. Each worker has two in flight, and convert's process holds each one twice
# (sent, and its record batch back). With two workers on 593 MB of JSON lines, convert's peak RSS
# was 184 MB with pieces of 8 MiB, 125 with 4 and 95 with 2, as fast (4.7-4.9 s against 5.0-5.2 s
# at 1,000 rows a batch). On 2 cores the plan parses in convert's own thread; more cores not measured.
PIECE_BYTES = 2 << 20
# a file smaller than this is parsed in convert's thread: starting workers would cost more
MIN_PARALLEL_BYTES = 48 << 20
WARNINGS_KEPT = 3  # a piece keeps the first messages of each bad-row reason, as many as convert logs


@dataclass
class _BadRow:
    reason: str
    where: str
    detail: str
    setting_fix: str | None
    kept_before: int  # rows of the piece that gave a text before this one


class _Stop(Exception):
    """A bad row under `on_bad_rows: error`: the piece ends here; convert raises it in file order."""


class _PieceRows(Rows):
    """Rows of one piece: bad rows are recorded for convert to replay, never logged or raised here."""

    def __init__(self, source: SourceConfig):
        super().__init__(source)
        self.recorded: list[_BadRow] = []
        self._fix_recorded = False

    def bad(self, reason: str, where: str, detail: str, setting_fix: str | None = None) -> None:
        event = _BadRow(reason, where, detail, setting_fix, self.kept)
        if self.source.on_bad_rows != "skip":
            self.recorded.append(event)
            raise _Stop
        self.dropped[reason] += 1
        first_fix = setting_fix is not None and self.kept == 0 and not self._fix_recorded
        if self.dropped[reason] <= WARNINGS_KEPT or first_fix:
            self.recorded.append(event)
            self._fix_recorded |= first_fix


@dataclass
class Piece:
    batch: pa.RecordBatch
    chars: np.ndarray  # each row's text length in characters (`Rebatcher`)
    rows_in: int
    kept: int
    dropped: dict[str, int]
    recorded: list[_BadRow]
    where: str | None  # the piece's `origins.json` template for its file, once a row gave a text


def parse_piece(piece: bytes, first_line: int, path: str, file: int, source: SourceConfig) -> Piece:
    """The rows of one piece of a JSON-lines file (lines `first_line`, ...), in a worker process."""
    from moai.stages.convert import kept_texts
    from moai.stages.convert.readers import json_lines

    rows = _PieceRows(source)
    texts: list[str] = []
    origins: list[int] = []
    wheres: dict[int, str | None] = {file: None}
    located = ((file, where, row) for where, row in json_lines(io.BytesIO(piece), path, rows, first_line))
    try:
        for text, origin in kept_texts(located, source, rows, {file: path}, wheres):
            texts.append(text)
            origins.append(origin)
    except _Stop:  # on_bad_rows: error, and this piece's first bad row: convert raises it in order
        pass
    chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    batch = text_batch(texts, origins)
    return Piece(batch, chars, rows.rows_in, rows.kept, dict(rows.dropped), rows.recorded, wheres[file])


def take(piece: Piece, rows: Rows) -> None:
    """Count a worker's piece into convert's `rows`, in file order: its bad rows replayed (logged,
    the setting's fix noted, the first one raised under `on_bad_rows: error`), then its counts."""
    kept, dropped = rows.kept, collections.Counter(rows.dropped)
    for event in piece.recorded:
        rows.kept = kept + event.kept_before  # what "no row gave a text yet" means at that row
        rows.bad(event.reason, event.where, event.detail, event.setting_fix)  # raises under error
    rows.kept = kept + piece.kept
    rows.rows_in += piece.rows_in
    for reason, n in piece.dropped.items():
        rows.dropped[reason] = dropped[reason] + n


class Workers:
    """A pool of worker processes, started the first time a file needs it, parsing pieces in order."""

    def __init__(self, count: int):
        self.count = count
        self._pool: ProcessPoolExecutor | None = None

    def parsed(
        self, pieces: Iterator[tuple[int, bytes]], path: str, file: int, source: SourceConfig
    ) -> Iterator[Piece]:
        """Each piece's result, in order; at most two pieces a worker in flight (bounded memory)."""
        if self._pool is None:
            # spawn: convert's process has threads (read-ahead, the reference tokenizer's pipes);
            # Ctrl-C is left to convert's process, which ends them (moai.workers)
            self._pool = spawn_pool(self.count)
        pending: collections.deque[Future[Piece]] = collections.deque()
        for first_line, data in pieces:
            pending.append(self._pool.submit(parse_piece, data, first_line, path, file, source))
            del data
            while len(pending) >= 2 * self.count:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class Rebatcher:
    """Record batches cut from batches of any size as one thread cuts them (`cut_after`): a batch
    ends at `size` rows or once its texts hold `max_chars` characters, whichever comes first (the
    last one what is left). Each is a fresh array as a sequential build makes it: Arrow writes a
    sliced array with other bytes."""

    def __init__(self, size: int, max_chars: int):
        self.size, self.max_chars = size, max_chars
        self._parts: collections.deque[tuple[pa.RecordBatch, np.ndarray]] = collections.deque()
        self._rows = 0

    def add(self, batch: pa.RecordBatch, chars: np.ndarray) -> Iterator[pa.RecordBatch]:
        if batch.num_rows:
            self._parts.append((batch, chars))
            self._rows += batch.num_rows
        while (n := self._next()) is not None:
            yield self._take(n)

    def flush(self) -> Iterator[pa.RecordBatch]:
        if self._rows:
            yield self._take(self._rows)

    def _next(self) -> int | None:
        """Rows of the next batch, once all of them are here."""
        if not self._rows:
            return None
        chars = np.concatenate([c for _, c in self._parts]) if len(self._parts) > 1 else self._parts[0][1]
        return cut_after(chars, self.size, self.max_chars)

    def _take(self, n: int) -> pa.RecordBatch:
        self._rows -= n
        first = self._parts[0][0]
        if first.num_rows == n and first.column(0).offset == 0:  # whole, as it was built
            return self._parts.popleft()[0]
        taken = []
        while n:
            part, chars = self._parts.popleft()
            if part.num_rows > n:
                self._parts.appendleft((part.slice(n), chars[n:]))
                part = part.slice(0, n)
            taken.append(part)
            n -= part.num_rows
        columns = [pa.concat_arrays([p.column(i) for p in taken]) for i in range(first.num_columns)]
        return pa.record_batch(columns, schema=first.schema)


def cut_after(chars: np.ndarray, size: int, max_chars: int) -> int | None:
    """Rows of the batch that starts these rows (their lengths in characters): up to the row that
    makes `size` rows or `max_chars` characters; None when the rows given reach neither."""
    head = chars[:size]
    over = np.flatnonzero(np.cumsum(head) >= max_chars)
    if len(over):
        return int(over[0]) + 1
    return size if len(chars) >= size else None
