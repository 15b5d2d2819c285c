"""convert's readers: the rows of each local format and of a hub dataset, and bad-row routing.

Each reader yields (where, row) pairs, `where` naming the file and line or row for messages.
Sequentially read files go through `HashingReader`, so what was parsed is what is hashed.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import io
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from moai.config import SourceConfig, template_fields
from moai.errors import DataError
from moai.remote import is_url, list_objects
from moai.stages.convert.compressed import (
    AHEAD_MIN_BYTES,
    CODECS,
    HEAD_BYTES,
    DecompressedAhead,
    SourceFile,
    codec_of,
    codec_of_name,
    corrupt,
    decompress_errors,
    decompressing,
    format_suffix,
)
from moai.stages.convert.fingerprint import (
    CHUNK_BYTES,
    FileRead,
    HashingReader,
    changed_file,
    digest_file,
    object_entry,
    object_read,
    stat_of,
)

log = logging.getLogger(__name__)


FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "txt"}


def source_files(source: SourceConfig) -> list[SourceFile]:
    """The files `source.path` names, sorted; a clear error if it names none we can read.

    A URL (`s3://bucket/prefix/*.jsonl.zst`) is listed through fsspec (`moai.remote`). A local
    file that exists is taken as named before the path is read as a glob: `data[1].jsonl` is
    that file, not `data1.jsonl`.
    """
    assert source.path is not None, "source_files is for a source of files (source.path)"
    matches: list[SourceFile]
    if is_url(source.path):
        matches = list(list_objects(source.path, source.storage_options))
        where = ""
    else:
        literal = Path(source.path).expanduser()
        if literal.is_file():
            matches = [literal]
        else:
            matches = [*sorted(Path(p) for p in glob.glob(str(literal), recursive=True) if Path(p).is_file())]
        where = f" (working directory: {Path.cwd()})"
    if not matches:
        raise DataError(f"source.path {source.path!r} matches no files{where}")
    for p in matches:
        _check_name(source, p)
    return matches


def format_of(path: SourceFile) -> str:
    """The format of a file that `source_files` accepted: `jsonl` for `a.jsonl` and `a.jsonl.zst`."""
    return FORMATS[format_suffix(path)]


def _check_name(source: SourceConfig, path: SourceFile) -> None:
    suffix = format_suffix(path)
    if suffix not in FORMATS:
        raise DataError(
            f"source.path {source.path!r}: cannot read {path} (extension {path.suffix!r}); "
            f"supported: {', '.join(sorted(FORMATS))}, text formats also compressed ({', '.join(CODECS)})"
        )
    if FORMATS[suffix] == "parquet" and codec_of_name(path) is not None:
        raise DataError(
            f"source.path {source.path!r}: {path} is a compressed parquet file; parquet compresses its own "
            "columns: decompress it to .parquet (or write it with parquet's compression= setting)"
        )


@functools.lru_cache(maxsize=4)
def load_hub(name: str, subset: str | None, split: str, trust_remote_code: bool):
    from moai import hub

    # offline and not cached: one line in seconds, not retries
    hub.resolve("source.hub", name, "dataset", fix=f"run {hub.dataset_fix(name, subset, split)}")
    import datasets

    kwargs = {"trust_remote_code": True} if trust_remote_code else {}
    if trust_remote_code:
        log.warning("source.trust_remote_code is on: %s may run code from the hub on this machine", name)
    try:
        return datasets.load_dataset(name, subset, split=split, **kwargs)
    except Exception as err:  # offline, unknown name, bad split: all end up here, named
        raise DataError(
            f"cannot load hub dataset {name!r} (subset={subset!r}, split={split!r}): {type(err).__name__}: {err}. "
            f"If this machine cannot reach the hub, run {hub.dataset_fix(name, subset, split)}."
        ) from err


COLUMN_FIX = "set source.text_field (or source.text_template, or source.messages_field) to the columns that hold it"


class Rows:
    """Counts and routes bad rows: raise naming the place, or skip and count the reason."""

    def __init__(self, source: SourceConfig):
        self.source = source
        self.dropped: Counter[str] = Counter()
        self.rows_in = 0
        self.kept = 0  # rows that gave a text so far
        self.setting_fix: str | None = None  # the setting to change when every row is bad the same way

    def bad(self, reason: str, where: str, detail: str, setting_fix: str | None = None) -> None:
        """`setting_fix`: what to set when the config, not the row, is wrong (a field no row has).
        Before any row gave a text it is the fix; skipping would skip every row."""
        if setting_fix is not None and self.kept == 0 and self.setting_fix is None:
            self.setting_fix = f"{where}: {detail}: {setting_fix}"
        if self.source.on_bad_rows == "skip":
            self.dropped[reason] += 1
            if self.dropped[reason] <= 3:
                log.warning("skipping %s: %s (%s)", where, reason, detail)
            return
        if setting_fix is not None and self.kept == 0:
            raise DataError(f"{where}: {detail}: {setting_fix}")
        raise DataError(f"{where}: {detail} (set source.on_bad_rows: skip to skip and count such rows)")


def _loads(line: str) -> Any:
    """`json.loads`, by orjson (~3x faster) where it accepts the line; what it refuses (NaN,
    integers past 64 bits, ...) goes to `json.loads`, which parses it or raises the usual message."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def json_lines(f: BinaryIO, path: SourceFile | str, rows: Rows, first: int = 1) -> Iterator[tuple[str, dict[str, Any]]]:
    """The objects of JSON lines; `first`: the number of the first line (a piece of a file, `parallel`)."""
    for lineno, raw in enumerate(f, first):
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
            obj = _loads(line)
        except json.JSONDecodeError as err:
            rows.bad("bad_json", where, f"malformed JSON: {err.msg.removesuffix(' at')} at column {err.colno}")
            continue
        if not isinstance(obj, dict):
            rows.bad("not_an_object", where, f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield where, obj


def _json_file(f: io.BufferedReader[Any], path: SourceFile, rows: Rows) -> Iterator[tuple[str, dict[str, Any]]]:
    head = f.peek(4096)[:4096].lstrip()  # peek: the bytes stay in the stream, read (and hashed) once
    if not head.startswith(b"["):
        yield from json_lines(f, path, rows)
        return
    try:
        items = json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: invalid UTF-8 at byte {err.start}") from None
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path}:{err.lineno}: malformed JSON: {err.msg.removesuffix(' at')} at column {err.colno}"
        ) from None
    for i, obj in enumerate(items):
        rows.rows_in += 1
        where = f"{path}[{i}]"
        if not isinstance(obj, dict):
            rows.bad("not_an_object", where, f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield where, obj


def _arrow_batches(path: SourceFile, data: Path | BinaryIO, kind: str, columns: list[str] | None):
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
            # newlines_in_values: a quoted field may hold line breaks at any size. Without it the
            # reader cuts 1 MiB blocks at bare newlines and fails on a quoted one crossing a block.
            # Measured on a 50 MB CSV: the reader alone 1.03x (0.095 s against 0.092 s), convert as a
            # whole within noise (best of 8: 1.18 s either way).
            reader = pcsv.open_csv(
                data,
                parse_options=pcsv.ParseOptions(newlines_in_values=True),
                convert_options=pcsv.ConvertOptions(column_types=types),
            )
            _check_columns(path, reader.schema.names, columns)
            yield from reader
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        msg = str(err)
        hint = " (invalid UTF-8?)" if "utf8" in msg.lower() or "utf-8" in msg.lower() else ""
        raise DataError(f"{path}: cannot read as {kind}{hint}: {msg}") from None


def _check_columns(path: SourceFile, names: list[str], needed: list[str] | None) -> None:
    missing = [c for c in needed or [] if c not in names]
    if missing:
        raise DataError(f"{path}: no column(s) {missing}; columns here: {names}; {COLUMN_FIX}")


def needed_fields(source: SourceConfig) -> list[str]:
    if source.text_field is not None:
        return [source.text_field]
    assert source.text_template is not None  # SourceConfig sets text_field when no template is given
    return list(template_fields(source.text_template))


def _table_rows(
    path: SourceFile, data: Path | BinaryIO, kind: str, source: SourceConfig, rows: Rows
) -> Iterator[tuple[str, dict[str, Any]]]:
    first = 0
    for batch in _arrow_batches(path, data, kind, needed_fields(source)):
        try:
            objs: list[dict[str, Any] | None] = batch.to_pylist()
        except UnicodeDecodeError:  # parquet writers need not check UTF-8: find the rows, one by one
            objs = [_decoded(batch.slice(i, 1), f"{path}:row {first + i}", rows) for i in range(batch.num_rows)]
        for i, obj in enumerate(objs):
            rows.rows_in += 1
            if obj is not None:
                yield f"{path}:row {first + i}", obj
        first += batch.num_rows


def _decoded(row, where: str, rows: Rows) -> dict[str, Any] | None:
    """The one row of a record batch as a dict, or None (a bad row) if a string in it is not UTF-8."""
    try:
        return row.to_pylist()[0]
    except UnicodeDecodeError as err:
        rows.bad("invalid_utf8", where, f"invalid UTF-8 at byte {err.start} of a string column")
        return None


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


def _txt_rows(f: BinaryIO, path: SourceFile, source: SourceConfig, rows: Rows) -> Iterator[tuple[str, dict[str, Any]]]:
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


@contextlib.contextmanager
def _opened(path: SourceFile, read: list[FileRead], fetched: io.RawIOBase | None) -> Iterator[io.BufferedReader[Any]]:
    """A text file's bytes as the parser reads them: hashed as they are read, decompressed if they
    are compressed (by name or by magic number); once the parser is done, the rest of the file is
    read and hashed too and what was read of it is appended to `read`."""
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(HashingReader(path, fetched))
        # peekable compressed bytes: the magic number is looked at without a second read of the file
        stored = stack.enter_context(io.BufferedReader(raw, CHUNK_BYTES))
        codec = codec_of(path, stored.peek(HEAD_BYTES)[:HEAD_BYTES])
        if codec is not None and codec_of_name(path) is None:
            log.info("%s: its bytes are %s-compressed: reading it decompressed", path, codec)
        f: io.BufferedReader[Any] = stored
        if codec is not None:
            decompressed = stack.enter_context(decompressing(stored, codec))
            if codec in ("zstd", "gzip") and file_size(path) >= AHEAD_MIN_BYTES:
                # on another core while this one parses; the buffer is small: the thread's chunks hold the rest
                f = stack.enter_context(
                    io.BufferedReader(stack.enter_context(DecompressedAhead(decompressed)), 1 << 20)
                )
            else:
                f = stack.enter_context(io.BufferedReader(decompressed, CHUNK_BYTES))
        try:
            yield f
        except GeneratorExit:  # closed early (a row before was refused): not an error of the data
            raise  # nor a reason to import the decompressors (at interpreter exit that import fails)
        except decompress_errors() as err:
            if codec is None:
                raise
            raise corrupt(path, codec, err) from None
        # Every reader reads to the end of what it parses; had one stopped early, the digest would
        # not match and convert would refuse to publish rather than trust it. A decompressor may
        # stop at the end of its last frame: the bytes after it are read and hashed too.
        while stored.read(CHUNK_BYTES):
            pass
        read.append(raw.digest.of(path) if isinstance(path, Path) else object_read(path, raw.digest))


def file_rows(
    path: SourceFile,
    source: SourceConfig,
    rows: Rows,
    read: list[FileRead],
    fetched: io.RawIOBase | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The rows of one file; once they are all out, what was read of it is appended to `read`.
    `fetched`: a remote object's bytes as a read-ahead thread fetches them (`read_ahead`)."""
    kind = format_of(path)
    if kind == "parquet":
        yield from _parquet_rows(path, source, rows, read)
        return
    with _opened(path, read, fetched) as f:
        yield from _stream_rows(f, kind, path, source, rows)


def in_pieces(
    path: SourceFile, read: list[FileRead], piece_bytes: int, fetched: io.RawIOBase | None = None
) -> Iterator[tuple[int, bytes]]:
    """A JSON-lines file as (number of the first line, bytes) pieces of about `piece_bytes`, each
    ending at a line end (the last one where the file ends), read as `file_rows` reads it."""
    line = 1
    with _opened(path, read, fetched) as f:
        rest = b""
        while block := f.read(piece_bytes):
            end = block.rfind(b"\n") + 1
            if not end:  # no line end in it: a line longer than a piece
                rest += block
                continue
            piece = rest + block[:end] if rest else block[:end]
            rest = block[end:]
            yield line, piece
            line += piece.count(b"\n")
        if rest:
            yield line, rest


def file_size(path: SourceFile) -> int:
    return path.stat().st_size if isinstance(path, Path) else path.size


def _stream_rows(
    f: io.BufferedReader[Any], kind: str, path: SourceFile, source: SourceConfig, rows: Rows
) -> Iterator[tuple[str, dict[str, Any]]]:
    if kind == "jsonl":
        yield from json_lines(f, path, rows)
    elif kind == "json":
        yield from _json_file(f, path, rows)
    elif kind == "txt":
        yield from _txt_rows(f, path, source, rows)
    elif f.peek(1):  # pyarrow refuses an empty CSV; it has no rows, as an empty .jsonl has none
        yield from _table_rows(path, f, kind, source, rows)


def _parquet_rows(
    path: SourceFile, source: SourceConfig, rows: Rows, read: list[FileRead]
) -> Iterator[tuple[str, dict[str, Any]]]:
    # Parquet is read by random access, so its bytes cannot be hashed as they pass: hash the file
    # again after reading it, and make sure it was neither written nor replaced in between (a
    # remote object: its listing's ETag and size, unchanged after reading).
    if not isinstance(path, Path):
        with path.open("rb", sequential=False) as f:
            yield from _table_rows(path, f, "parquet", source, rows)
        if path.current() != path:
            raise DataError(changed_file(path.url))
        read.append(object_entry(path))
        return
    before = stat_of(path)
    yield from _table_rows(path, path, "parquet", source, rows)
    after = digest_file(path)
    if stat_of(path) != before:
        raise DataError(changed_file(path))
    read.append(after)


def hub_rows(source: SourceConfig, rows: Rows, batch_size: int) -> Iterator[tuple[str, dict[str, Any]]]:
    ds = load_hub(source.hub, source.subset, source.split, source.trust_remote_code)
    missing = [c for c in needed_fields(source) if c not in ds.column_names]
    if missing:
        raise DataError(f"hub dataset {source.hub!r}: no column(s) {missing}; columns: {ds.column_names}; {COLUMN_FIX}")
    i = 0
    for batch in ds.iter(batch_size=batch_size):
        keys = list(batch)
        for values in zip(*batch.values(), strict=True):
            rows.rows_in += 1
            yield f"{source.hub}[{i}]", dict(zip(keys, values, strict=True))
            i += 1
