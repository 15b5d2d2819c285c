"""convert's JSON lines parsed by worker processes (`moai.stages.convert.parallel`) against one
thread: the same dataset byte for byte, the same report, the same warnings and the same errors.

The pieces are made tiny (a few hundred bytes) so that every file is cut into many, lines cross
piece ends, one line is longer than a piece, and batches of `writer_batch_size` rows are cut
across pieces and files.
"""

import json
import logging
import re

import pytest

from conftest import write_jsonl
from moai.config import parse_config
from moai.errors import DataError
from moai.stages.convert import convert, parallel, source_fingerprint

TEMPLATE = "{q}\n{a}"


def src(path, **kw):
    return parse_config({"source": {"path": str(path), **kw}, "tokenizer": {"path": "t"}}).source


@pytest.fixture
def tiny_pieces(monkeypatch):
    monkeypatch.setattr(parallel, "PIECE_BYTES", 300)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)


def build(source, out, workers, caplog):
    """(files of the output by name, report without timings, warnings logged) or the DataError's text."""
    caplog.clear()
    out.mkdir(parents=True)
    try:
        with caplog.at_level(logging.WARNING, logger="moai.stages.convert"):
            report = convert(
                source,
                out,
                source_fp=source_fingerprint(source),
                writer_batch_size=7,
                max_shard_size="4KB",
                workers=workers,
            )
    except DataError as err:
        return str(err)
    assert ("workers" in report) == (workers > 1)  # the pieces went to worker processes
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    report = {k: v for k, v in report.items() if k not in ("seconds", "mb_per_s", "workers")}
    return files, report, [r.getMessage() for r in caplog.records]


def same_both_ways(source, tmp_path, caplog):
    one = build(source, tmp_path / "one", 1, caplog)
    three = build(source, tmp_path / "three", 3, caplog)
    assert one == three
    return one


def rows(n, start=0):
    return [{"q": f"question {i} 한국어", "a": "answer " * (i % 9)} for i in range(start, start + n)]


def test_same_dataset_bytes_across_files_pieces_and_batches(tiny_pieces, tmp_path, caplog):
    d = tmp_path / "data"
    write_jsonl(d / "a.jsonl", rows(120))
    # a line longer than a piece, blank lines, and no line end at the end of the file
    lines = [json.dumps(r, ensure_ascii=False) for r in rows(40, 120)]
    lines[5] = json.dumps({"q": "long", "a": "x" * 2000})
    (d / "b.jsonl").write_text("\n".join(lines[:10]) + "\n\n   \n" + "\n".join(lines[10:]), encoding="utf-8")
    (d / "c.csv").write_text("q,a\n" + "".join(f"csv {i},row {i}\n" for i in range(15)))  # one thread
    write_jsonl(d / "d.jsonl", rows(33, 200))
    files, report, _ = same_both_ways(src(f"{d}/*", text_template=TEMPLATE), tmp_path, caplog)
    assert report["rows_out"] == 120 + 40 + 15 + 33 and report["dropped"] == {}
    assert sum(name.startswith("data-") for name in files) > 1  # several shards, each cut the same way
    where = json.loads(files["origins.json"])["where"]
    assert where == ["{file}:{row}", "{file}:{row}", "{file}:row {row}", "{file}:{row}"]


def test_record_batches_end_at_their_rows_or_characters_the_same_both_ways(tiny_pieces, tmp_path, caplog, monkeypatch):
    """A record batch ends at writer_batch_size rows (7 here) or once its texts hold
    RECORD_BATCH_CHARS characters, whichever comes first, across pieces and files; one thread and
    three workers write the same bytes."""
    import pyarrow as pa

    from moai.stages import convert as convert_module

    monkeypatch.setattr(convert_module, "RECORD_BATCH_CHARS", 200)
    d = tmp_path / "data"
    write_jsonl(d / "a.jsonl", rows(70))
    write_jsonl(d / "b.jsonl", [{"q": "long", "a": "y" * 400}, *rows(30, 70)])  # a row over the limit
    files, report, _ = same_both_ways(src(f"{d}/*", text_template=TEMPLATE), tmp_path, caplog)
    assert report["rows_out"] == 101
    texts = []
    for name in sorted(n for n in files if n.startswith("data-")):
        with pa.ipc.open_stream(files[name]) as reader:
            for batch in reader:
                texts.append(batch.column(0).to_pylist())
    assert sum(map(len, texts)) == 101
    for batch in texts[:-1]:  # every batch but the last ends at the first row that reaches a limit
        total = [sum(len(t) for t in batch[: i + 1]) for i in range(len(batch))]
        assert len(batch) == 7 or (total[-1] >= 200 and all(c < 200 for c in total[:-1]))
    assert any(len(b) < 7 for b in texts[:-1]) and any(len(b) == 7 for b in texts)  # both limits cut
    assert any(b[-1].startswith("long") for b in texts)  # the row over the limit ends its batch


def test_bad_rows_skipped_are_counted_and_logged_as_by_one_thread(tiny_pieces, tmp_path, caplog):
    lines = []
    for i in range(90):
        kind = i % 6
        if kind == 0:
            lines.append("{not json")
        elif kind == 1:
            lines.append("[1, 2]")
        elif kind == 2:
            lines.append(json.dumps({"q": 3, "z": 1}))  # no field a
        elif kind == 3:
            lines.append(json.dumps({"q": ["x"], "a": "y"}))  # not text
        elif kind == 4:
            lines.append('{"q": "lone \\ud800", "a": "b"}')  # a lone surrogate
        else:
            lines.append(json.dumps({"q": f"good {i}", "a": "fine"}))
    f = tmp_path / "bad.jsonl"
    f.write_bytes(("\n".join(lines) + "\n").encode() + b'{"q": "\xff", "a": "x"}\n')  # invalid UTF-8 last
    _, report, warnings = same_both_ways(src(f, text_template=TEMPLATE, on_bad_rows="skip"), tmp_path, caplog)
    assert report["rows_out"] == 15
    assert report["dropped"] == {
        "bad_json": 15,
        "not_an_object": 15,
        "missing_field": 15,
        "not_text": 15,
        "invalid_unicode": 15,
        "invalid_utf8": 1,
    }
    assert len(warnings) == 5 * 3 + 1  # the first three of each reason, as one thread logs them


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{oops", r"bad\.jsonl:61: malformed JSON"),
        ('{"q": "x"}', r"bad\.jsonl:61: source\.text_template needs \['a'\].*set source\.on_bad_rows: skip"),
    ],
)
def test_the_first_bad_row_is_the_error_whatever_piece_it_is_in(tiny_pieces, tmp_path, caplog, bad, message):
    lines = [json.dumps(r, ensure_ascii=False) for r in rows(100)]
    lines[60] = lines[80] = bad
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    error = same_both_ways(src(f, text_template=TEMPLATE), tmp_path, caplog)
    assert isinstance(error, str)
    assert re.search(message, error), error


@pytest.mark.parametrize("on_bad_rows", ["error", "skip"])
def test_a_field_no_row_has_names_the_setting(tiny_pieces, tmp_path, caplog, on_bad_rows):
    f = write_jsonl(tmp_path / "m.jsonl", [{"content": f"x{i}", "id": i} for i in range(60)])
    error = same_both_ways(src(f, on_bad_rows=on_bad_rows), tmp_path, caplog)
    assert isinstance(error, str) and "set source.text_field to the field that holds the text" in error
    assert "m.jsonl:1: no field 'text'" in error if on_bad_rows == "error" else "none of its 60 rows" in error


def test_a_file_changed_after_its_fingerprint_is_refused(tiny_pieces, tmp_path, caplog):
    f = write_jsonl(tmp_path / "c.jsonl", rows(50))
    source = src(f, text_template=TEMPLATE)
    taken = source_fingerprint(source)
    write_jsonl(f, rows(51))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DataError, match=rf"^source file {f} "):
        convert(source, out, source_fp=taken, writer_batch_size=7, max_shard_size="4KB", workers=3)
    assert not (out / "state.json").exists()
