"""Writing and reading the text stages' `save_to_disk` folders in bounded batches.

We write Arrow record batches straight to a stream file, then let `datasets` lay it out as a
`save_to_disk` folder. No `datasets.map`/`filter` runs on our data: they write cache files next
to their input (inside a published folder) and race in shared cache dirs, which is the
`FileNotFoundError: .../tmpXXXX` our users hit.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

TEXT_SCHEMA = pa.schema([("text", pa.string())])


def write_text_dataset(batches: Iterable[list[str] | pa.RecordBatch], out_dir: Path, max_shard_size: str) -> int:
    """Write batches of texts as a `save_to_disk` folder in `out_dir`; return the row count."""
    with DatasetWriter(out_dir, TEXT_SCHEMA) as writer:
        for batch in batches:
            if not isinstance(batch, pa.RecordBatch):
                batch = pa.record_batch([pa.array(batch, type=pa.string())], schema=TEXT_SCHEMA)
            writer.write(batch)
        return writer.finish(max_shard_size)


class DatasetWriter:
    """Record batches of `schema` streamed to `<out_dir>/_work/raw.arrow`, then laid out by `finish`
    as a `save_to_disk` folder in `out_dir` (the work file is removed)."""

    def __init__(self, out_dir: Path, schema: pa.Schema):
        self.out_dir, self.schema, self.rows = out_dir, schema, 0
        self.work = out_dir / "_work"
        self.work.mkdir(parents=True, exist_ok=True)
        self._sink = pa.OSFile(str(self.work / "raw.arrow"), "wb")
        self._writer = pa.ipc.new_stream(self._sink, schema)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc) -> None:
        self._close()

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._writer.write_batch(batch)
            self.rows += batch.num_rows

    def _close(self) -> None:
        if not self._sink.closed:
            self._writer.close()
            self._sink.close()

    def finish(self, max_shard_size: str) -> int:
        import datasets

        self._close()
        from moai.store import file_digest

        ds = datasets.Dataset.from_file(str(self.work / "raw.arrow"))
        # `datasets` fingerprints a file by its path, here a temporary folder's: state.json would
        # differ from build to build, machine to machine, and two machines sharing a remote cache
        # would upload different bytes for one key. A hash of the rows makes it the content's.
        ds._fingerprint = file_digest(self.work / "raw.arrow")
        was_on = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # a bar per written folder; the stages report their own progress
        try:
            # With no rows, `datasets` writes no shard at all and cannot open the folder again: one empty shard.
            shards = {"num_shards": 1} if self.rows == 0 else {"max_shard_size": max_shard_size}
            ds.save_to_disk(str(self.out_dir), **shards)
        finally:
            if was_on:
                datasets.enable_progress_bars()
        del ds
        shutil.rmtree(self.work)
        return self.rows


def open_text(path: Path | str):
    """Open a text stage output (a Dataset or DatasetDict folder) with `datasets.load_from_disk`."""
    import datasets

    return datasets.load_from_disk(str(path))


def text_batches(table: pa.Table, batch_size: int, start: int = 0, stop: int | None = None) -> Iterator[pa.RecordBatch]:
    """Record batches of at most `batch_size` rows over rows [start, stop) of a memory-mapped table."""
    stop = table.num_rows if stop is None else stop
    for lo in range(start, stop, batch_size):
        part = table.slice(lo, min(batch_size, stop - lo))
        yield from part.to_batches()


class MappedTable:
    """The Arrow shards of a `save_to_disk` folder (one split of a DatasetDict), memory-mapped as one table.

    Reads `state.json` and the shards with pyarrow alone: worker processes open their row ranges
    without importing `datasets` and without any text crossing a pipe. Pages of a mapped file
    that were read count in the process's RSS until unmapped; `release()` drops them (they are
    read again from the page cache if touched), so a pass over a corpus keeps RSS flat.
    """

    def __init__(self, dataset_dir: Path | str, split: str | None = None):
        import json
        import mmap

        folder = Path(dataset_dir) / split if split else Path(dataset_dir)
        state = json.loads((folder / "state.json").read_text())
        self._maps = []
        tables = []
        for entry in state["_data_files"]:
            with open(folder / entry["filename"], "rb") as f:
                if f.seek(0, 2) == 0:
                    continue
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            # Never closed: the table's buffers point into the map, which lives as long as they do.
            self._maps.append(mm)
            tables.append(pa.ipc.open_stream(pa.py_buffer(mm)).read_all())
        if not tables:
            self.table = TEXT_SCHEMA.empty_table()
        else:
            self.table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def release(self) -> None:
        import mmap

        for mm in self._maps:
            mm.madvise(mmap.MADV_DONTNEED)


def open_split_table(dataset_dir: Path | str, split: str | None = None) -> pa.Table:
    """The memory-mapped table of a `save_to_disk` folder or one split of it (see `MappedTable`)."""
    return MappedTable(dataset_dir, split).table


def text_bytes(table: pa.Table) -> np.ndarray:
    """The UTF-8 byte length of each row of a text table (0 for a null), as int64."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    return pc.binary_length(table.column(0)).fill_null(0).to_numpy().astype(np.int64)


def row_bytes(column, row: int) -> memoryview:
    """The UTF-8 bytes of one value of a (chunked) string column, without copying them."""
    for chunk in column.chunks:
        if row < len(chunk):
            break
        row -= len(chunk)
    if chunk.null_count and not chunk[row].is_valid:
        return memoryview(b"")
    offsets_type = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
    _, offsets_buf, data_buf = chunk.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offsets_type)
    start, stop = int(offsets[chunk.offset + row]), int(offsets[chunk.offset + row + 1])
    return memoryview(data_buf)[start:stop]
