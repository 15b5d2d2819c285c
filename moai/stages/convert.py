r"""convert: read the source (local files or a hub dataset) and build one `text` column.

Local formats by extension: `.jsonl`/`.ndjson` (one object a line), `.json` (JSON lines, or one
array of objects), `.parquet`, `.csv`, `.txt` (by line, paragraph or whole file). The text comes
from `text_field` or from `text_template` formatted over the row's fields.

`.txt` with `txt_sample_by: line`: a line ends at "\n" or "\r\n" and at nothing else (form
feed, \x85, U+2028 stay inside it); the newline that ends the file starts no extra row; empty
lines are rows (the filter drops them as empty). With `paragraph`: paragraphs end at one or more
blank lines (empty or only spaces and tabs, "\n" or "\r\n" endings alike); whitespace-only
pieces are skipped.

A bad row is a row that cannot give a text: invalid UTF-8, malformed JSON, a JSON value that is
not an object, a missing field, or a value that is not text. A text field must hold a string
(null gives an empty text, which the filter drops as empty); a list, dict, bytes, number or bool
there is a bad row (`not_text`), because its `str()` is a Python repr, not the document. A
template formats strings and numbers ("Score: {score}") and null as ""; a list, dict, bytes or
bool it would format is a bad row too. With `source.on_bad_rows: error` (the default) the first
bad row stops convert with a `DataError` naming its file and line or row; with `skip` bad rows
are skipped and counted by reason in the report's `dropped`.

The store keeps convert's output under a key chained from `source_fingerprint`, taken before
convert runs (each local file's name, length and xxh3-128 of its bytes). convert hashes the bytes
it parses as it reads them, with the same code (parquet, read by random access, is hashed again
after reading and must keep its size, mtime and inode), and raises `DataError` naming the file if
they are not the fingerprinted bytes: a file written during a run is never cached under a key
that describes other bytes. Hub datasets keep the `datasets` fingerprint.
"""

from __future__ import annotations

import functools
import glob
import io
import json
import logging
import os
import re
import string
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from moai.config import PipelineConfig, SourceConfig, template_fields
from moai.errors import DataError
from moai.formats.text import write_text_dataset

log = logging.getLogger(__name__)

NAME = "convert"
VERSION = 2  # 2: a value that is not text is a bad row, no longer its repr; .txt lines end at \n or \r\n only
READS = ("source",)  # the root: `source_fingerprint` of the files (or the hub dataset)
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "txt"}


def settings(config: PipelineConfig) -> dict[str, Any]:
    """What changes the output besides the source's content (which is the root of the key)."""
    return config.source.model_dump(exclude={"path", "hub", "split", "subset"})


def build(ctx, out: Path) -> dict[str, Any]:
    """The stage in the graph (`moai.pipeline`): the source's rows → `out`."""
    return convert(
        ctx.config.source,
        out,
        source_fp=ctx.inputs["source"],
        writer_batch_size=ctx.plan.writer_batch_size.value,
        max_shard_size=ctx.config.save.max_shard_size,
    )


def source_files(source: SourceConfig) -> list[Path]:
    """The local files `source.path` names, sorted; a clear error if it names none we can read."""
    assert source.path is not None, "source_files is for a local source (source.path)"
    pattern = str(Path(source.path).expanduser())
    matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    if not matches:
        raise DataError(f"source.path {source.path!r} matches no files (working directory: {Path.cwd()})")
    unknown = [p for p in matches if p.suffix.lower() not in FORMATS]
    if unknown:
        raise DataError(
            f"source.path {source.path!r}: cannot read {unknown[0]} (extension {unknown[0].suffix!r}); "
            f"supported: {', '.join(sorted(FORMATS))}"
        )
    return matches


@functools.lru_cache(maxsize=4)
def _load_hub(name: str, subset: str | None, split: str, trust_remote_code: bool):
    import datasets

    kwargs = {"trust_remote_code": True} if trust_remote_code else {}
    if trust_remote_code:
        log.warning("source.trust_remote_code is on: %s may run code from the hub on this machine", name)
    try:
        return datasets.load_dataset(name, subset, split=split, **kwargs)
    except Exception as err:  # offline, unknown name, bad split: all end up here, named
        raise DataError(
            f"cannot load hub dataset {name!r} (subset={subset!r}, split={split!r}): {type(err).__name__}: {err}. "
            "If this machine is offline, download it where you have network "
            f"(datasets.load_dataset({name!r}).to_json('data/{name.split('/')[-1]}.jsonl')), "
            "copy the files here and set source.path to them instead of source.hub."
        ) from err


CHUNK_BYTES = 1 << 22


class _Digest:
    """xxh3-128 and length of one file's bytes, fed in file order: the same code hashes a file for
    the fingerprint and while convert reads it, so the two can only differ if the bytes do."""

    def __init__(self) -> None:
        import xxhash

        self._hash = xxhash.xxh3_128()
        self.size = 0

    def update(self, chunk: bytes | memoryview) -> None:
        self._hash.update(chunk)
        self.size += len(chunk)

    def of(self, path: Path) -> _FileRead:
        return _FileRead(str(path), path.name, self.size, self._hash.hexdigest())


class _FileRead(NamedTuple):
    path: str
    name: str
    size: int
    digest: str

    def content(self) -> tuple[str, int, str]:
        return self.name, self.size, self.digest


def _files_fingerprint(files: list[_FileRead]) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    for f in files:
        h.update(f"{f.name}\0{f.size}\0{f.digest}\0".encode())
    return f"files:{h.hexdigest()}"


def _digest_file(path: Path) -> _FileRead:
    digest = _Digest()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.of(path)


# The per-file digests behind the fingerprints this process took (a few, newest last), so that
# convert can name the file that changed since; a fingerprint from another process has none here.
_TAKEN: dict[tuple[str | None, str], list[_FileRead]] = {}
_TAKEN_LOCK = threading.Lock()  # Prefect may run tasks in threads


def source_fingerprint(source: SourceConfig) -> str:
    """Root of every key: the `datasets` fingerprint of a hub dataset, or a content hash of local
    files (name, length and bytes of each); `convert` checks it against the bytes it reads."""
    if source.hub is not None:
        ds = _load_hub(source.hub, source.subset, source.split, source.trust_remote_code)
        return f"hub:{source.hub}:{ds._fingerprint}"
    files = [_digest_file(p) for p in source_files(source)]
    fingerprint = _files_fingerprint(files)
    with _TAKEN_LOCK:
        _TAKEN.pop((source.path, fingerprint), None)
        _TAKEN[(source.path, fingerprint)] = files
        while len(_TAKEN) > 8:
            del _TAKEN[next(iter(_TAKEN))]
    return fingerprint


class _HashingReader(io.RawIOBase):
    """A file read once front to back, hashing its bytes as they pass: the digest is of exactly
    the bytes convert parsed, whatever happens to the file meanwhile."""

    def __init__(self, path: Path):
        super().__init__()
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 (the reader owns it: closed by close())
        self.digest = _Digest()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        n = self._file.readinto(buffer)
        if n:
            self.digest.update(memoryview(buffer)[:n])
        return n

    def readall(self) -> bytes:
        data = self._file.readall()
        self.digest.update(data)
        return data

    def close(self) -> None:
        self._file.close()
        super().close()


def _stat(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


class _Rows:
    """Counts and routes bad rows: raise naming the place, or skip and count the reason."""

    def __init__(self, source: SourceConfig):
        self.source = source
        self.dropped: Counter[str] = Counter()
        self.rows_in = 0

    def bad(self, reason: str, where: str, detail: str) -> None:
        if self.source.on_bad_rows == "skip":
            self.dropped[reason] += 1
            if self.dropped[reason] <= 3:
                log.warning("skipping %s: %s (%s)", where, reason, detail)
            return
        raise DataError(f"{where}: {detail} (set source.on_bad_rows: skip to skip and count such rows)")


def _text_of(row: dict[str, Any], source: SourceConfig, rows: _Rows, where: str) -> str | None:
    if source.text_field is not None:
        return _field_text(row, source.text_field, rows, where)
    assert source.text_template is not None  # SourceConfig sets text_field when no template is given
    return _template_text(row, source.text_template, rows, where)


def _field_text(row: dict[str, Any], field: str, rows: _Rows, where: str) -> str | None:
    if field not in row:
        rows.bad("missing_field", where, f"no field {field!r} (source.text_field); fields here: {sorted(row)}")
        return None
    value = row[field]
    if value is None:  # no text: an empty row, which the filter drops and counts as empty
        return ""
    if isinstance(value, str):
        return value
    # str() of a list, bytes or number is a Python repr, not the document: never train on it silently.
    rows.bad("not_text", where, f"source.text_field {field!r} holds {_kind(value)}, not text: {_preview(value)}")
    return None


def _formattable(value: Any) -> bool:
    """What a template may format: text and numbers ("Score: {score}"); None stands for ""."""
    # bool is an int, but "True" in a prompt is a repr, not something the data's author wrote.
    return value is None or (isinstance(value, (str, int, float)) and not isinstance(value, bool))


class _NotText(Exception):
    def __init__(self, field: str, value: Any):
        super().__init__(field)
        self.field, self.value = field, value


class _CheckedFormatter(string.Formatter):
    """`str.format` that checks each value it formats, after look-ups like `{turns[0]}` or `{meta.title}`."""

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        value, first = super().get_field(field_name, args, kwargs)
        if not _formattable(value):
            raise _NotText(field_name, value)
        return ("" if value is None else value), first


_CHECKED = _CheckedFormatter()


def _template_text(row: dict[str, Any], template: str, rows: _Rows, where: str) -> str | None:
    fields = template_fields(template)
    missing = [f for f in fields if f not in row]
    if missing:
        rows.bad("missing_field", where, f"source.text_template needs {missing} but the row has only {sorted(row)}")
        return None
    if all(_formattable(row[f]) for f in fields):  # the common case, at the speed of str.format
        return template.format_map({k: ("" if v is None else v) for k, v in row.items()})
    # A list or dict may still be indexed into text ({turns[0]}): check what is actually formatted.
    try:
        return _CHECKED.vformat(template, (), row)
    except _NotText as err:
        rows.bad(
            "not_text",
            where,
            f"source.text_template field {err.field!r} holds {_kind(err.value)}, not text or a number: "
            f"{_preview(err.value)}",
        )
        return None


def _kind(value: Any) -> str:
    """'a list', 'a dict', 'bytes', 'an int': the type of a value, in words for an error message."""
    name = type(value).__name__
    if name in ("bytes", "bytearray"):
        return "bytes"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _preview(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_lines(f: BinaryIO, path: Path, rows: _Rows) -> Iterator[tuple[str, dict[str, Any]]]:
    for lineno, raw in enumerate(f, 1):
        where = f"{path}:{lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            rows.rows_in += 1
            rows.bad("invalid_utf8", where, f"invalid UTF-8 at byte {err.start} of the line")
            continue
        if not line.strip():
            continue
        rows.rows_in += 1
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            rows.bad("bad_json", where, f"malformed JSON: {err.msg} at column {err.colno}")
            continue
        if not isinstance(obj, dict):
            rows.bad("not_an_object", where, f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield where, obj


def _json_file(f: io.BufferedReader[_HashingReader], path: Path, rows: _Rows) -> Iterator[tuple[str, dict[str, Any]]]:
    head = f.peek(4096)[:4096].lstrip()  # peek: the bytes stay in the stream, read (and hashed) once
    if not head.startswith(b"["):
        yield from _json_lines(f, path, rows)
        return
    try:
        items = json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: invalid UTF-8 at byte {err.start}") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: malformed JSON: {err.msg} at column {err.colno}") from None
    for i, obj in enumerate(items):
        rows.rows_in += 1
        where = f"{path}[{i}]"
        if not isinstance(obj, dict):
            rows.bad("not_an_object", where, f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield where, obj


def _arrow_batches(path: Path, data: Path | BinaryIO, kind: str, columns: list[str] | None):
    """Record batches of `data`: the parquet file's path (read by random access) or the CSV's stream."""
    import pyarrow as pa

    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(data)
            names = pf.schema_arrow.names
            _check_columns(path, names, columns)
            yield from pf.iter_batches(batch_size=10_000, columns=columns)
        else:
            import pyarrow.csv as pcsv

            # Declared string, so invalid UTF-8 fails here instead of arriving as binary.
            types = {c: pa.string() for c in columns or []}
            reader = pcsv.open_csv(data, convert_options=pcsv.ConvertOptions(column_types=types))
            _check_columns(path, reader.schema.names, columns)
            yield from reader
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        msg = str(err)
        hint = " (invalid UTF-8?)" if "utf8" in msg.lower() or "utf-8" in msg.lower() else ""
        raise DataError(f"{path}: cannot read as {kind}{hint}: {msg}") from None


def _check_columns(path: Path, names: list[str], needed: list[str] | None) -> None:
    missing = [c for c in needed or [] if c not in names]
    if missing:
        raise DataError(f"{path}: no column(s) {missing}; columns here: {names}")


def _needed_fields(source: SourceConfig) -> list[str]:
    if source.text_field is not None:
        return [source.text_field]
    assert source.text_template is not None  # SourceConfig sets text_field when no template is given
    return template_fields(source.text_template)


def _table_rows(
    path: Path, data: Path | BinaryIO, kind: str, source: SourceConfig, rows: _Rows
) -> Iterator[tuple[str, dict[str, Any]]]:
    first = 0
    for batch in _arrow_batches(path, data, kind, _needed_fields(source)):
        for i, obj in enumerate(batch.to_pylist()):
            rows.rows_in += 1
            yield f"{path}:row {first + i}", obj
        first += batch.num_rows


# The end of a paragraph: its last line break and one or more blank lines (empty, or only spaces
# and tabs), with \n or \r\n endings alike.
_BLANK_LINES = re.compile(r"\r?\n(?:[ \t]*\r?\n)+")


def _lines(text: str) -> list[str]:
    r"""The lines of a text file: ended by \n or \r\n only.

    Not `str.splitlines`, which also breaks at \f, \v, \x1c-\x1e, \x85, U+2028 and U+2029:
    characters that occur inside real lines (page breaks in code, NEL in legacy text).
    """
    *ended, last = text.split("\n")
    lines = [line[:-1] if line.endswith("\r") else line for line in ended]
    if last:  # text after the last \n is a line; the \n that ends the file starts none
        lines.append(last)
    return lines


def _txt_rows(f: BinaryIO, path: Path, source: SourceConfig, rows: _Rows) -> Iterator[tuple[str, dict[str, Any]]]:
    data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        rows.rows_in += 1
        rows.bad("invalid_utf8", f"{path}:{line}", f"invalid UTF-8 at byte {err.start} of the file")
        return
    if source.txt_sample_by == "document":
        pieces = [text]
    elif source.txt_sample_by == "paragraph":
        pieces = [p for p in _BLANK_LINES.split(text) if p.strip()]
    else:
        pieces = _lines(text)
    for i, piece in enumerate(pieces):
        rows.rows_in += 1
        yield f"{path}:{i + 1}", {"text": piece}


def _file_rows(
    path: Path, source: SourceConfig, rows: _Rows, read: list[_FileRead]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The rows of one file; once they are all out, what was read of it is appended to `read`."""
    kind = FORMATS[path.suffix.lower()]
    if kind == "parquet":
        yield from _parquet_rows(path, source, rows, read)
        return
    with io.BufferedReader(_HashingReader(path), CHUNK_BYTES) as f:
        if kind == "jsonl":
            yield from _json_lines(f, path, rows)
        elif kind == "json":
            yield from _json_file(f, path, rows)
        elif kind == "txt":
            yield from _txt_rows(f, path, source, rows)
        else:
            yield from _table_rows(path, f, kind, source, rows)
        # Every reader above reads to the end; had one stopped early, the digest would not match
        # and convert would refuse to publish rather than trust it.
        read.append(f.raw.digest.of(path))


def _parquet_rows(
    path: Path, source: SourceConfig, rows: _Rows, read: list[_FileRead]
) -> Iterator[tuple[str, dict[str, Any]]]:
    # Parquet is read by random access, so its bytes cannot be hashed as they pass: hash the file
    # again after reading it, and make sure it was neither written nor replaced in between.
    before = _stat(path)
    yield from _table_rows(path, path, "parquet", source, rows)
    after = _digest_file(path)
    if _stat(path) != before:
        raise DataError(_changed_file(path))
    read.append(after)


def _changed_file(path: Path | str) -> str:
    return (
        f"source file {path} changed while convert was reading it (its content no longer matches the "
        "fingerprint taken at the start); nothing was published — rerun when the file is no longer being written"
    )


def _check_read(source: SourceConfig, source_fp: str, read: list[_FileRead]) -> None:
    """Refuse to publish unless the bytes convert read are the bytes `source_fp` fingerprinted:
    the store keys this output by `source_fp`, and a key must describe exactly what it holds."""
    if _files_fingerprint(read) == source_fp:
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
        raise DataError(_changed_file(changed[0]))
    if len(read) == 1:
        raise DataError(_changed_file(read[0].path))
    # The fingerprint came from another process: which file differs cannot be told, only that one does.
    raise DataError(
        f"source.path {source.path!r}: one of its {len(read)} files changed while convert was reading them "
        "(their content no longer matches the fingerprint taken at the start); nothing was published — rerun "
        "when the files are no longer being written"
    )


def _hub_rows(source: SourceConfig, rows: _Rows, batch_size: int) -> Iterator[tuple[str, dict[str, Any]]]:
    ds = _load_hub(source.hub, source.subset, source.split, source.trust_remote_code)
    missing = [c for c in _needed_fields(source) if c not in ds.column_names]
    if missing:
        raise DataError(f"hub dataset {source.hub!r}: no column(s) {missing}; columns: {ds.column_names}")
    i = 0
    for batch in ds.iter(batch_size=batch_size):
        keys = list(batch)
        for values in zip(*batch.values(), strict=True):
            rows.rows_in += 1
            yield f"{source.hub}[{i}]", dict(zip(keys, values, strict=True))
            i += 1


def convert(
    source: SourceConfig, out_dir: Path, *, source_fp: str, writer_batch_size: int, max_shard_size: str
) -> dict[str, Any]:
    """Read every row of the source and write its text as a `save_to_disk` folder. Returns the report.

    `source_fp` is `source_fingerprint(source)` taken before (the key this output is stored under);
    local files that no longer match it raise `DataError` before the dataset is saved (so the
    store publishes nothing).
    """
    started = time.perf_counter()
    rows = _Rows(source)
    read: list[_FileRead] = []
    if source.hub is not None:
        located: Iterator[tuple[str, dict[str, Any]]] = _hub_rows(source, rows, writer_batch_size)
        files = [source.hub]
    else:
        paths = source_files(source)
        files = [str(p) for p in paths]
        located = (item for p in paths for item in _file_rows(p, source, rows, read))

    def batches() -> Iterator[list[str]]:
        buf: list[str] = []
        for where, row in located:
            text = _text_of(row, source, rows, where)
            if text is None:
                continue
            buf.append(text)
            if len(buf) >= writer_batch_size:
                yield buf
                buf = []
        if source.hub is None:  # the `datasets` fingerprint of a hub dataset is its own affair
            _check_read(source, source_fp, read)
        if buf:
            yield buf

    rows_out = write_text_dataset(batches(), out_dir, max_shard_size)
    return {
        "rows_in": rows.rows_in,
        "rows_out": rows_out,
        "dropped": dict(rows.dropped),
        "files": len(files),
        "seconds": round(time.perf_counter() - started, 3),
    }
