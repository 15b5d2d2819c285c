"""Writing and reading the text stages' `save_to_disk` folders in bounded batches.

We write Arrow record batches straight into the shard files of a `save_to_disk` folder
(`DatasetWriter`). No `datasets.map`/`filter` runs on our data: they write cache files next
to their input (inside a published folder) and race in shared cache dirs, which is the
`FileNotFoundError: .../tmpXXXX` our users hit.

Every text folder has two columns: `text`, and `origin` (int64: the row's file index << 40 | its
row number in that file, null where unknown), and convert writes `origins.json` beside the shards:
the source's files (or hub dataset) and how each names a row (`"{file}:{row}"`, `"{file}[{row}]"`,
`"{file}:row {row}"`, as convert's messages do). Each text stage keeps both as rows are kept
(`copy_origin_files`), so a stored document names the file and row it came from (`moai.trace`).
Readers take the text as column 0; the origin column costs 8 bytes a row.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

TEXT_SCHEMA = pa.schema([("text", pa.string()), ("origin", pa.int64())])
ORIGIN_FILES = "origins.json"
ROW_BITS = 40  # origin = file index << ROW_BITS | row: rows up to 2**40, files up to 2**23


def text_batch(text: pa.Array | list[str], origin: pa.Array | list[int] | None = None) -> pa.RecordBatch:
    """A record batch of TEXT_SCHEMA; without `origin`, the origins are null (unknown)."""
    text = text if isinstance(text, pa.Array) else pa.array(text, type=pa.string())
    if origin is None:
        origin = pa.nulls(len(text), type=pa.int64())
    elif not isinstance(origin, pa.Array):
        origin = pa.array(origin, type=pa.int64())
    return pa.record_batch([text, origin], schema=TEXT_SCHEMA)


def origin_column(table: pa.Table) -> pa.ChunkedArray:
    """The origin column of a text table (all null for a table without one)."""
    if "origin" in table.column_names:
        return table.column("origin")
    return pa.chunked_array([pa.nulls(table.num_rows, type=pa.int64())])


def origins_of(table: pa.Table) -> np.ndarray:
    """The origins of a text table's rows as int64, -1 where unknown."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    return origin_column(table).fill_null(-1).to_numpy().astype(np.int64, copy=False)


def split_origin(origin: int) -> tuple[int, int]:
    """(file index, row) of an origin."""
    return origin >> ROW_BITS, origin & ((1 << ROW_BITS) - 1)


def copy_origin_files(in_dir: Path, out_dir: Path) -> None:
    """Keep the input's `origins.json` (the source's files) beside a stage's output."""
    import shutil

    src = Path(in_dir) / ORIGIN_FILES
    if src.exists():
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, Path(out_dir) / ORIGIN_FILES)


def write_text_dataset(batches: Iterable[list[str] | pa.RecordBatch], out_dir: Path, max_shard_size: str) -> int:
    """Write batches of texts (lists of str: origins unknown) as a `save_to_disk` folder in
    `out_dir`; return the row count."""
    with DatasetWriter(out_dir, TEXT_SCHEMA, max_shard_size) as writer:
        for batch in batches:
            writer.write(batch if isinstance(batch, pa.RecordBatch) else text_batch(batch))
        return writer.finish()


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}


def size_bytes(size: str | int) -> int:
    """'256MB' -> 256_000_000, '1GiB' -> 2**30 (the units `datasets` reads in max_shard_size)."""
    if isinstance(size, int):
        return size
    text = size.strip().upper()
    digits = text.rstrip("KMGIB")
    unit = text[len(digits) :]
    if not digits or unit not in _UNITS:
        raise ValueError(f"{size!r} is not a size like 256MB or 1GiB")
    return int(float(digits) * _UNITS[unit])


class DatasetWriter:
    """Record batches of `schema` streamed into Arrow shard files of about `max_shard_size` each, laid
    out by `finish` as a `save_to_disk` folder in `out_dir` that `datasets.load_from_disk` opens.

    The shards are written as the batches come, in the stream format `datasets` itself writes: no
    second pass over the data, and nothing the size of the data is held in memory or mapped (a
    `save_to_disk` of the whole table mapped it and, for the splits, copied it into memory: peak
    RSS grew with the corpus). The fingerprint in state.json is a hash of the rows written."""

    def __init__(self, out_dir: Path, schema: pa.Schema, max_shard_size: str | int = "256MB"):
        import xxhash

        self.out_dir, self.schema, self.rows = out_dir, schema, 0
        self.max_shard_bytes = size_bytes(max_shard_size)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.shards: list[Path] = []
        self._sink: pa.OSFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._shard_bytes = 0
        self._hash = xxhash.xxh3_64()

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc) -> None:
        self._close()

    def _open(self) -> None:
        self._close()
        path = self.out_dir / f"_shard-{len(self.shards):05d}.arrow"
        self.shards.append(path)
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)
        self._shard_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        if self._writer is None or self._shard_bytes >= self.max_shard_bytes:
            self._open()
        assert self._writer is not None
        self._writer.write_batch(batch)
        self._shard_bytes += batch.nbytes
        self.rows += batch.num_rows
        self._hash.update(str(batch.num_rows).encode())
        for column in batch.columns:
            for buf in column.buffers():
                if buf is not None:
                    self._hash.update(memoryview(buf))

    def _close(self) -> None:
        if self._writer is not None and self._sink is not None and not self._sink.closed:
            self._writer.close()
            self._sink.close()

    def finish(self) -> int:
        """Name the shards as `save_to_disk` does and write its state.json and dataset_info.json."""
        import json

        if not self.shards:  # `datasets` cannot open a folder without a shard: one empty shard
            self._open()
        self._close()
        n = len(self.shards)
        names = [f"data-{i:05d}-of-{n:05d}.arrow" for i in range(n)]
        for path, name in zip(self.shards, names, strict=True):
            path.rename(self.out_dir / name)
        info = {
            "citation": "",
            "description": "",
            "features": features_dict(self.schema),
            "homepage": "",
            "license": "",
        }
        (self.out_dir / "dataset_info.json").write_text(json.dumps(info, indent=2))
        state: dict[str, Any] = {
            "_data_files": [{"filename": name} for name in names],
            "_fingerprint": self._hash.hexdigest(),
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": None,
        }
        (self.out_dir / "state.json").write_text(json.dumps(state, indent=2))
        return self.rows


# Arrow types `datasets` describes as a plain `Value` of the same name (its `Features.to_dict`).
_VALUE_DTYPES = {
    pa.string(): "string",
    pa.large_string(): "large_string",
    pa.binary(): "binary",
    pa.bool_(): "bool",
    **{getattr(pa, f"{kind}{bits}")(): f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)},
    pa.float32(): "float32",
    pa.float64(): "float64",
}


def features_dict(schema: pa.Schema) -> dict[str, Any]:
    """What `datasets.Features.from_arrow_schema(schema).to_dict()` gives, for a schema of plain
    columns without importing `datasets` (about 1 s of a cold `moai prepare`, in the middle of
    convert); any other column type asks `datasets` itself."""
    if all(f.type in _VALUE_DTYPES for f in schema) and not schema.metadata:
        return {f.name: {"dtype": _VALUE_DTYPES[f.type], "_type": "Value"} for f in schema}
    from datasets import Features

    return Features.from_arrow_schema(schema).to_dict()


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


def filled(texts: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Texts with a null as "". `fill_null` copies every text even where there is no null (a sixth
    of the tokenize stage's reading on a 600 MB corpus), so it runs only where there is one."""
    return texts.fill_null("") if texts.null_count else texts


def text_list(texts: pa.Array | pa.ChunkedArray) -> list[str]:
    """Texts as Python strings, a null as "" (`filled`)."""
    return filled(texts).to_pylist()


def text_bytes(table: pa.Table) -> np.ndarray:
    """The UTF-8 byte length of each row of a text table (0 for a null), as int64."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    return pc.binary_length(table.column(0)).fill_null(0).to_numpy().astype(np.int64)


class ColumnRows:
    """The UTF-8 bytes of single values of a (chunked) string column, without copying them: the
    chunks and where each starts are found once. Walking `column.chunks` for each row (the
    `row_bytes` this replaced) made a Python object per chunk each time: the check's 1,695 rows
    out of convert's 530 record batches took 0.35 s of the reference process' CPU, beside the
    stages it should leave the cores to."""

    def __init__(self, column) -> None:
        self.chunks = column.chunks
        self.starts = np.cumsum([0] + [len(c) for c in self.chunks], dtype=np.int64)
        self._offsets: dict[int, tuple[np.ndarray, memoryview]] = {}

    def __call__(self, row: int) -> memoryview:
        if not 0 <= row < self.starts[-1]:
            raise IndexError(f"row {row} of a column of {int(self.starts[-1])} rows")
        i = int(np.searchsorted(self.starts, row, side="right")) - 1
        chunk, row = self.chunks[i], row - int(self.starts[i])
        if chunk.null_count and not chunk[row].is_valid:
            return memoryview(b"")
        if i not in self._offsets:
            offsets_type = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
            _, offsets_buf, data_buf = chunk.buffers()
            self._offsets[i] = (np.frombuffer(offsets_buf, dtype=offsets_type), memoryview(data_buf))
        offsets, data = self._offsets[i]
        start, stop = int(offsets[chunk.offset + row]), int(offsets[chunk.offset + row + 1])
        return data[start:stop]
