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
not an object, a missing field, a value that is not text, or a text with a lone surrogate
(`invalid_unicode`: a JSON escape such as "\ud800" without its pair, which `json` accepts but
is no Unicode text and no UTF-8 can hold). A text field must hold a string
(null gives an empty text, which the filter drops as empty); a list, dict, bytes, number or bool
there is a bad row (`not_text`), because its `str()` is a Python repr, not the document. A
template formats strings and numbers ("Score: {score}") and null as ""; a list, dict, bytes or
bool it would format is a bad row too. With `source.on_bad_rows: error` (the default) the first
bad row stops convert with a `DataError` naming its file and line or row; with `skip` bad rows
are skipped and counted by reason in the report's `dropped`.

An output without a document is an error, not a published empty folder (which would only fail
later, in the filter): empty files, files of blank lines or only a header, a hub split with no
rows, or every row bad and skipped each raise a `DataError` saying which.

The store keeps convert's output under a key chained from `source_fingerprint`, taken before
convert runs (each local file's name, length and xxh3-128 of its bytes). convert hashes the bytes
it parses as it reads them, with the same code (parquet, read by random access, is hashed again
after reading and must keep its size, mtime and inode), and raises `DataError` naming the file if
they are not the fingerprinted bytes: a file written during a run is never cached under a key
that describes other bytes. Hub datasets keep the `datasets` fingerprint.

The package: `readers` (the rows of each format, bad-row routing), `fingerprint` (hashing what
is read, refusing what changed), `compressed` (codecs, decompression beside the parser),
`read_ahead` (remote objects fetched N at a time, `source.num_parallel_reads`), `chunks` (the
stream both hand their chunks through); this module is the stage: text from rows, and `convert`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import string
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from moai.config import PipelineConfig, SourceConfig, template_fields
from moai.errors import DataError
from moai.formats.text import ORIGIN_FILES, ROW_BITS, text_batch, write_text_dataset
from moai.report import timing
from moai.stages.convert import parallel
from moai.stages.convert.compressed import SourceFile
from moai.stages.convert.fingerprint import (
    FileRead,
    check_read,
    digest_file,
    files_fingerprint,
    object_entry,
    remember,
)
from moai.stages.convert.read_ahead import ReadAhead
from moai.stages.convert.readers import (
    FORMATS,
    Rows,
    file_rows,
    file_size,
    format_of,
    hub_rows,
    in_pieces,
    load_hub,
    source_files,
)

__all__ = ["FORMATS", "NAME", "READS", "VERSION", "build", "convert", "settings", "source_files", "source_fingerprint"]

log = logging.getLogger(__name__)

_ROW_NUMBER = re.compile(r"(\d+)\]?$")  # the row's number at the end of a reader's `where`

NAME = "convert"
# A record batch of the text ends at writer_batch_size rows (the plan's 10,000) or at this many
# characters of text, whichever comes first. At 10,000 rows alone, 1.6 KB records made 16 MB
# batches, and moving batches that size cost time and memory in convert and filter: cold `moai
# prepare` of 593 MB of JSON lines on 2 cores, convert 4.3-5.1 s and filter 1.5-1.7 s, now 3.3-3.8
# s and 0.5-0.6 s (save 0.3 s, now 0.4-0.6), the run's peak RSS 522 MB, now 466; 1.5M rows of
# ~60 bytes are still cut at 10,000 rows (docs/performance.md, "Peak memory over the corpus").
RECORD_BATCH_CHARS = 1 << 20
# 2: a value that is not text is a bad row, no longer its repr; .txt lines end at \n or \r\n only
# 3: an `origin` column (file index, row) beside the text, and origins.json naming the files
VERSION = 4  # 4: record batches end at RECORD_BATCH_CHARS characters too (the same rows, other bytes)
READS = ("source",)  # the root: `source_fingerprint` of the files (or the hub dataset)


def settings(config: PipelineConfig) -> dict[str, Any]:
    """What changes the output besides the source's content (which is the root of the key). It runs
    on one source's config: with several sources, each source's node has its own (`moai.sources`)."""
    assert config.source is not None
    # text sources leave the chat settings out, so their keys stay as they were before chat data; the
    # chat template is tokenize's (its text is in tokenize's key), so changing it re-runs tokenize only
    chat = {"format", "messages_field"} if config.source.format == "text" else set()
    # storage_options and num_parallel_reads say how to reach the files, not what they hold (the fingerprint says that)
    exclude = {"path", "hub", "split", "subset", "chat_template", "storage_options", "num_parallel_reads", *chat}
    return config.source.model_dump(exclude=exclude)


def build(ctx, out: Path) -> dict[str, Any]:
    """The stage in the graph (`moai.pipeline`): the source's rows → `out`."""
    return convert(
        ctx.config.source,
        out,
        source_fp=ctx.inputs["source"],
        writer_batch_size=ctx.plan.writer_batch_size.value,
        max_shard_size=ctx.config.save.max_shard_size,
        workers=ctx.plan.convert_workers.value,
    )


def source_fingerprint(source: SourceConfig) -> str:
    """Root of every key: the `datasets` fingerprint of a hub dataset, or a content hash of local
    files (name, length and bytes of each); `convert` checks it against the bytes it reads."""
    if source.hub is not None:
        ds = load_hub(source.hub, source.subset, source.split, source.trust_remote_code)
        return f"hub:{source.hub}:{ds._fingerprint}"
    files = [digest_file(p) if isinstance(p, Path) else object_entry(p) for p in source_files(source)]
    fingerprint = files_fingerprint(files)
    remember(source.path, fingerprint, files)
    return fingerprint


def _text_of(row: dict[str, Any], source: SourceConfig, rows: Rows, where: str) -> str | None:
    if source.format == "chat":
        return _chat_text(row, source.messages_field, rows, where)
    if source.text_field is not None:
        return _field_text(row, source.text_field, rows, where)
    assert source.text_template is not None  # SourceConfig sets text_field when no template is given
    return _template_text(row, source.text_template, rows, where)


def _chat_text(row: dict[str, Any], field: str, rows: Rows, where: str) -> str | None:
    """A chat row's messages as JSON (what tokenize renders with the chat template), or a bad row:
    no such field, not a non-empty list, or a message without a role and text content."""
    if field not in row:
        rows.bad(
            "missing_field",
            where,
            f"no field {field!r} (source.messages_field); fields here: {sorted(row)}",
            "set source.messages_field to the field that holds the messages",
        )
        return None
    messages = row[field]
    if not isinstance(messages, list) or not messages:
        rows.bad("not_chat", where, f"source.messages_field {field!r} holds {_kind(messages)}, not a list of messages")
        return None
    kept = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            rows.bad("not_chat", where, f"a message is not {{role: text, content: text}}: {_preview(m)}")
            return None
        kept.append({"role": m["role"], "content": m["content"]})
    return json.dumps(kept, ensure_ascii=False)


def _field_text(row: dict[str, Any], field: str, rows: Rows, where: str) -> str | None:
    if field not in row:
        rows.bad(
            "missing_field",
            where,
            f"no field {field!r} (source.text_field); fields here: {sorted(row)}",
            "set source.text_field to the field that holds the text (or source.text_template to join several)",
        )
        return None
    value = row[field]
    if value is None:  # no text: an empty row, which the filter drops and counts as empty
        return ""
    if isinstance(value, str):
        return value
    # str() of a list, bytes or number is a Python repr, not the document: never train on it silently.
    rows.bad("not_text", where, f"source.text_field {field!r} holds {_kind(value)}, not text: {_preview(value)}")
    return None


def _unicode(text: str, row: dict[str, Any], source: SourceConfig, rows: Rows, where: str) -> bool:
    """Whether `text` is Unicode that UTF-8 (Arrow) can hold; a lone surrogate makes it a bad row.

    Only JSON can carry one (an escape such as "\\ud800" without its pair): the other formats are
    decoded from UTF-8. ASCII texts pass at once (isascii is O(1) in CPython); the others are
    encoded once: 1-4% of convert's time on a 50 MB JSONL of English and Korean (within noise).
    """
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        char = f"\\u{ord(text[err.start]):04x}"
        rows.bad(
            "invalid_unicode",
            where,
            f"{_surrogate_origin(row, source)} holds a lone surrogate {char} (a JSON escape without its pair): "
            "not valid Unicode",
        )
        return False
    return True


def _surrogate_origin(row: dict[str, Any], source: SourceConfig) -> str:
    """Which field of the row holds the lone surrogate, in words, for the error message."""
    if source.text_field is not None:
        return f"source.text_field {source.text_field!r}"
    assert source.text_template is not None
    for name in template_fields(source.text_template):
        value = row.get(name)
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"field {name!r} (in source.text_template)"
    return "the text of source.text_template"  # nested, as in {turns[0]}


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


def _template_text(row: dict[str, Any], template: str, rows: Rows, where: str) -> str | None:
    fields = template_fields(template)
    missing = [f for f in fields if f not in row]
    if missing:
        rows.bad(
            "missing_field",
            where,
            f"source.text_template needs {missing} but the row has only {sorted(row)}",
            "set source.text_template to use the fields the rows have",
        )
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


def kept_texts(
    located: Iterator[tuple[int, str, dict[str, Any]]],
    source: SourceConfig,
    rows: Rows,
    files: Sequence[str] | dict[int, str],
    wheres: list[str | None] | dict[int, str | None],
) -> Iterator[tuple[str, int]]:
    """(text, origin) of each row that gives a text; the bad ones go to `rows`. `wheres[file]` is
    set to the file's row template for origins.json ("{file}:{row}") at its first kept row."""
    for file, where, row in located:
        text = _text_of(row, source, rows, where)
        if text is None or not _unicode(text, row, source, rows, where):
            continue
        rows.kept += 1
        number = _ROW_NUMBER.search(where)
        assert number is not None, where  # every reader's `where` ends in the row's number
        if wheres[file] is None:
            wheres[file] = "{file}" + where[len(files[file]) : number.start(1)] + "{row}" + where[number.end(1) :]
        yield text, file << ROW_BITS | int(number.group(1))


def convert(
    source: SourceConfig,
    out_dir: Path,
    *,
    source_fp: str,
    writer_batch_size: int,
    max_shard_size: str,
    workers: int = 1,
) -> dict[str, Any]:
    """Read every row of the source and write its text as a `save_to_disk` folder. Returns the report.

    `source_fp` is `source_fingerprint(source)` taken before (the key this output is stored under);
    local files that no longer match it raise `DataError` before the dataset is saved (so the
    store publishes nothing). `workers`: processes that parse large JSON-lines files (`parallel`;
    the output is the same bytes with any number).
    """
    started = time.perf_counter()
    rows = Rows(source)
    read: list[FileRead] = []
    paths = [] if source.hub is not None else source_files(source)
    # the next remote objects' bytes fetched while one is parsed; parsed in order all the same
    ahead = ReadAhead(paths, source.num_parallel_reads)
    files = [source.hub] if source.hub is not None else [str(p) for p in paths]
    wheres: list[str | None] = [None] * len(files)
    pool = parallel.Workers(workers)

    def in_parallel(path: SourceFile) -> bool:
        return workers > 1 and format_of(path) == "jsonl" and file_size(path) >= parallel.MIN_PARALLEL_BYTES

    def located(i: int, path: SourceFile) -> Iterator[tuple[int, str, dict[str, Any]]]:
        # a generator: the file is opened (a remote one's read-ahead taken) when its rows are wanted
        for where, row in file_rows(path, source, rows, read, ahead.stream(i)):
            yield i, where, row

    def parsed_here(
        located: Iterator[tuple[int, str, dict[str, Any]]],
    ) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
        """Batches of the rows' texts, parsed in this thread, cut as `Rebatcher` cuts them, with
        each row's length in characters."""
        texts: list[str] = []
        origins: list[int] = []
        chars: list[int] = []
        total = 0
        for text, origin in kept_texts(located, source, rows, files, wheres):
            texts.append(text)
            origins.append(origin)
            chars.append(len(text))
            total += chars[-1]
            if len(texts) == writer_batch_size or total >= RECORD_BATCH_CHARS:
                yield text_batch(texts, origins), np.array(chars, dtype=np.int64)
                texts, origins, chars, total = [], [], [], 0
        if texts:
            yield text_batch(texts, origins), np.array(chars, dtype=np.int64)

    def parsed_by_workers(i: int, path: SourceFile) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
        """Batches of a JSON-lines file's texts, its pieces parsed by the workers (`parallel`)."""
        pieces = in_pieces(path, read, parallel.PIECE_BYTES, ahead.stream(i))
        for piece in pool.parsed(pieces, files[i], i, source):
            parallel.take(piece, rows)
            if wheres[i] is None:
                wheres[i] = piece.where
            yield piece.batch, piece.chars

    def batches() -> Iterator[pa.RecordBatch]:
        # batches of writer_batch_size rows or RECORD_BATCH_CHARS across files, however each file's
        # rows were parsed
        cut = parallel.Rebatcher(writer_batch_size, RECORD_BATCH_CHARS)
        if source.hub is not None:
            for batch, chars in parsed_here((0, *item) for item in hub_rows(source, rows, writer_batch_size)):
                yield from cut.add(batch, chars)
        for i, path in enumerate(paths):
            for batch, chars in parsed_by_workers(i, path) if in_parallel(path) else parsed_here(located(i, path)):
                yield from cut.add(batch, chars)
        if source.hub is None:  # the `datasets` fingerprint of a hub dataset is its own affair
            check_read(source, source_fp, read)
        yield from cut.flush()

    with ahead, contextlib.closing(pool):
        rows_out = write_text_dataset(batches(), out_dir, max_shard_size)
    (out_dir / ORIGIN_FILES).write_text(json.dumps({"files": files, "where": wheres}))
    if rows_out == 0:  # raised inside the build: the store publishes nothing
        raise DataError(_no_documents(source, rows, read))
    return {
        "rows_in": rows.rows_in,
        "rows_out": rows_out,
        "dropped": dict(rows.dropped),
        "files": len(files),
        **({"workers": workers} if any(in_parallel(p) for p in paths) else {}),
        **(
            {"seconds": round(time.perf_counter() - started, 3)}  # a hub dataset's bytes are not counted
            if source.hub is not None
            else timing(sum(f.size for f in read) / 1e6, started)  # the local files' bytes, as read
        ),
    }


def _no_documents(source: SourceConfig, rows: Rows, read: list[FileRead]) -> str:
    """Why convert gave no document, on one line: nothing to read, or every row bad and skipped."""
    if source.hub is not None:
        what = f"hub dataset {source.hub!r} (subset={source.subset!r}, split={source.split!r})"
    elif len(read) == 1:
        what = read[0].path
    else:
        what = f"source.path {source.path!r} ({len(read)} files)"
    if rows.rows_in:  # with on_bad_rows: error the first bad row would have stopped convert
        counts = ", ".join(f"{reason}: {n}" for reason, n in rows.dropped.most_common())
        if rows.setting_fix is not None and rows.dropped["missing_field"] == rows.rows_in:
            return (
                f"convert: {what} gave 0 documents: none of its {rows.rows_in} rows has the field the config "
                f"names; the first, {rows.setting_fix}"
            )
        return (
            f"convert: {what} gave 0 documents: every one of its {rows.rows_in} rows was bad and skipped "
            f"by source.on_bad_rows: skip ({counts}); fix the data or source.text_field/text_template "
            "(on_bad_rows: error stops at the first bad row, naming its file and line)"
        )
    if source.hub is not None:
        return f"convert: {what} gave 0 documents (it has no rows); check source.split and source.subset"
    if len(read) == 1:
        return f"convert: {what} gave 0 documents ({_no_rows(read[0])}); check source.path"
    why = "; ".join(f"{f.path}: {_no_rows(f)}" for f in read[:3]) + ("; ..." if len(read) > 3 else "")
    return f"convert: {what} gave 0 documents ({why}); check source.path"


def _no_rows(f: FileRead) -> str:
    """Why a file that was read gave no row, in words."""
    if f.size == 0:
        return "the file is empty"
    kind = format_of(Path(f.path))
    return {
        "csv": "a header and no rows",
        "parquet": "the table has 0 rows",
        "json": "no objects: an empty array or only blank lines",
    }.get(kind, "only blank lines")
