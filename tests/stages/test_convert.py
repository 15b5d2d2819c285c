"""convert and filter: formats, templates, and every kind of bad input the issue lists."""

import contextlib
import json
import logging
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import config_dict, run_offline, write_jsonl
from moai import pipeline
from moai.config import parse_config
from moai.errors import DataError
from moai.formats.text import open_text
from moai.stages.convert import convert, source_fingerprint
from moai.stages.filter import filter_text


def src(path, **kw):
    return parse_config({"source": {"path": str(path), **kw}, "tokenizer": {"path": "t"}}).source


def run(source, tmp_path, source_fp=None):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    source_fp = source_fingerprint(source) if source_fp is None else source_fp
    report = convert(source, out, source_fp=source_fp, writer_batch_size=2, max_shard_size="1MB")
    return report, open_text(out)["text"]


def test_every_local_format(tmp_path):
    d = tmp_path / "d"
    write_jsonl(d / "a.jsonl", [{"text": "one"}, {"text": "two"}])
    (d / "b.json").write_text(json.dumps([{"text": "three"}]))
    pq.write_table(pa.table({"text": ["four"], "other": [1]}), d / "c.parquet")
    (d / "e.csv").write_text("text,n\nfive,1\n")
    (d / "f.txt").write_text("six\nseven\n")
    report, texts = run(src(d / "*"), tmp_path)
    assert texts == ["one", "two", "three", "four", "five", "six", "seven"]
    assert report["rows_in"] == 7 and report["rows_out"] == 7 and report["files"] == 5


def test_text_template(tmp_path):
    f = write_jsonl(tmp_path / "i.jsonl", [{"input": "Q?", "solution": "A!", "extra": 1}])
    _, texts = run(src(f, text_template="{input}\n{solution}"), tmp_path)
    assert texts == ["Q?\nA!"]


def test_malformed_json_names_file_and_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "ok"}\n{"text": broken}\n{"text": "fine"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: malformed JSON"):
        run(src(f), tmp_path)
    report, texts = run(src(f, on_bad_rows="skip"), tmp_path)
    assert texts == ["ok", "fine"] and report["dropped"] == {"bad_json": 1} and report["rows_in"] == 3


def test_invalid_utf8_names_file_and_line(tmp_path):
    f = tmp_path / "latin.jsonl"
    f.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"latin\.jsonl:2: invalid UTF-8"):
        run(src(f), tmp_path)
    report, texts = run(src(f, on_bad_rows="skip"), tmp_path)
    assert texts == ["ok"] and report["dropped"] == {"invalid_utf8": 1}


def test_invalid_utf8_in_txt_and_csv(tmp_path):
    t = tmp_path / "t.txt"
    t.write_bytes(b"fine\nbad \xff\n")
    with pytest.raises(DataError, match=r"t\.txt:2: invalid UTF-8"):
        run(src(t), tmp_path)
    c = tmp_path / "c.csv"
    c.write_bytes(b"text\nok\nbad \xff\n")
    with pytest.raises(DataError, match=r"c\.csv.*UTF-8"):
        run(src(c), tmp_path)


def test_missing_text_field_lists_fields(tmp_path):
    f = write_jsonl(tmp_path / "m.jsonl", [{"content": "x", "id": 1}])
    with pytest.raises(DataError, match=r"m\.jsonl:1: no field 'text'.*\['content', 'id'\]"):
        run(src(f), tmp_path)
    with pytest.raises(DataError, match=r"needs \['solution'\] but the row has only \['content', 'id', 'input'\]"):
        write_jsonl(f, [{"content": "x", "id": 1, "input": "q"}])
        run(src(f, text_template="{input}{solution}"), tmp_path)
    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"body": ["x"]}), p)
    with pytest.raises(DataError, match=r"no column\(s\) \['text'\]; columns here: \['body'\]"):
        run(src(p), tmp_path)


def test_a_text_field_missing_from_the_first_rows_names_the_setting_never_the_skip_hint(tmp_path):
    f = write_jsonl(tmp_path / "m.jsonl", [{"content": "x", "id": 1}, {"content": "y", "id": 2}])
    with pytest.raises(DataError) as err:
        run(src(f), tmp_path)
    assert "fields here: ['content', 'id']: set source.text_field to the field that holds the text" in str(err.value)
    assert "on_bad_rows" not in str(err.value)
    with pytest.raises(DataError) as err:  # skipping every row gives nothing: the setting is still the fix
        run(src(f, on_bad_rows="skip"), tmp_path)
    assert "none of its 2 rows has the field" in str(err.value) and "set source.text_field" in str(err.value)
    assert "['content', 'id']" in str(err.value)
    # a row missing it after good rows is a bad row: skipping it is a fix
    f = write_jsonl(tmp_path / "m.jsonl", [{"text": "a"}, {"content": "y"}])
    with pytest.raises(DataError, match=r"m\.jsonl:2: no field 'text'.*set source\.on_bad_rows: skip"):
        run(src(f), tmp_path)


def test_missing_field_rows_can_be_skipped(tmp_path):
    f = write_jsonl(tmp_path / "m.jsonl", [{"text": "a"}, {"body": "b"}, {"text": None}])
    report, texts = run(src(f, on_bad_rows="skip"), tmp_path)
    assert texts == ["a", ""] and report["dropped"] == {"missing_field": 1}


def test_source_matching_no_files(tmp_path):
    with pytest.raises(DataError, match=r"matches no files"):
        run(src(tmp_path / "nothing" / "*.jsonl"), tmp_path)
    (tmp_path / "x.xml").write_text("<a/>")
    with pytest.raises(DataError, match=r"extension '\.xml'"):
        run(src(tmp_path / "x.xml"), tmp_path)


@pytest.mark.slow
def test_offline_hub_error_names_dataset_and_local_way(tmp_path):
    out = run_offline(
        "from moai.config import parse_config\n"
        "from moai.stages.convert import source_fingerprint\n"
        "source_fingerprint(\n"
        "    parse_config({'source': {'hub': 'nobody/no-such-dataset-xyz'}, 'tokenizer': {'path': 't'}}).source\n"
        ")\n",
        tmp_path,
    )
    assert out.returncode != 0
    assert "ConfigError: source.hub nobody/no-such-dataset-xyz: not in the local Hugging Face cache" in out.stderr
    assert "split='train').to_json(" in out.stderr and "set source.path" in out.stderr


def test_filter_counts_each_reason(tmp_path):
    f = write_jsonl(tmp_path / "f.jsonl", [{"text": t} for t in ["", "   ", "ab", "abcd", "abcdefghijk", "abcde"]])
    conv = tmp_path / "conv"
    conv.mkdir()
    convert(src(f), conv, source_fp=source_fingerprint(src(f)), writer_batch_size=2, max_shard_size="1MB")
    out = tmp_path / "filt"
    out.mkdir()
    cfg = parse_config(
        {"source": {"path": "x"}, "tokenizer": {"path": "t"}, "filter": {"min_chars": 3, "max_chars": 6}}
    ).filter
    report = filter_text(cfg, conv, out, batch_size=4, max_shard_size="1MB")
    assert report["dropped"] == {"empty": 2, "too_short": 1, "too_long": 1}
    assert open_text(out)["text"] == ["abcd", "abcde"]


def test_everything_filtered_out_is_an_error(tmp_path):
    f = write_jsonl(tmp_path / "f.jsonl", [{"text": " "}, {"text": ""}])
    conv = tmp_path / "conv"
    conv.mkdir()
    convert(src(f), conv, source_fp=source_fingerprint(src(f)), writer_batch_size=2, max_shard_size="1MB")
    out = tmp_path / "filt"
    out.mkdir()
    cfg = parse_config({"source": {"path": "x"}, "tokenizer": {"path": "t"}}).filter
    with pytest.raises(DataError, match=r"every one of 2 rows was filtered out"):
        filter_text(cfg, conv, out, batch_size=4, max_shard_size="1MB")


@pytest.mark.parametrize(
    "value, kind",
    [
        (["a", "b"], r"a list, not text: \['a', 'b'\]"),
        ({"k": 1}, r"a dict, not text: \{'k': 1\}"),
        (3, "an int, not text: 3"),
        (1.5, "a float, not text: 1.5"),
        (True, "a bool, not text: True"),
    ],
)
def test_text_field_that_is_not_text_is_a_bad_row(tmp_path, value, kind):
    f = write_jsonl(tmp_path / "n.jsonl", [{"text": "ok"}, {"text": value}, {"text": None}, {"text": "fine"}])
    with pytest.raises(
        DataError, match=rf"n\.jsonl:2: source\.text_field 'text' holds {kind} \(set source\.on_bad_rows"
    ):
        run(src(f), tmp_path)
    report, texts = run(src(f, on_bad_rows="skip"), tmp_path)
    assert texts == ["ok", "", "fine"]  # null stays an empty text, for the filter to drop as empty
    assert report["dropped"] == {"not_text": 1} and report["rows_in"] == 4 and report["rows_out"] == 3


def test_parquet_list_and_binary_columns_are_not_text(tmp_path):
    lists = tmp_path / "lists.parquet"
    pq.write_table(pa.table({"text": pa.array([["a", "b"], None, ["c"]], pa.list_(pa.string()))}), lists)
    with pytest.raises(
        DataError, match=r"lists\.parquet:row 0: source\.text_field 'text' holds a list, not text: \['a', 'b'\]"
    ):
        run(src(lists), tmp_path)
    report, texts = run(src(lists, on_bad_rows="skip"), tmp_path)
    assert texts == [""] and report["dropped"] == {"not_text": 2}

    blobs = tmp_path / "blobs.parquet"
    pq.write_table(pa.table({"text": pa.array([b"caf\xc3\xa9", None, b"x"], pa.binary())}), blobs)
    with pytest.raises(
        DataError, match=r"blobs\.parquet:row 0: source\.text_field 'text' holds bytes, not text: b'caf\\xc3"
    ):
        run(src(blobs), tmp_path)
    report, texts = run(src(blobs, on_bad_rows="skip"), tmp_path)
    assert texts == [""] and report["dropped"] == {"not_text": 2}


def test_template_formats_text_and_numbers_only(tmp_path):
    f = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"q": "Q", "score": 3},
            {"q": "Q", "score": 0.5},
            {"q": None, "score": 1},
            {"q": ["a"], "score": 1},
            {"q": "Q", "score": True},
            {"q": {"x": 1}, "score": 2},
            {"q": "Q", "score": None},
        ],
    )
    template = "{q} / Score: {score}"
    with pytest.raises(
        DataError, match=r"t\.jsonl:4: source\.text_template field 'q' holds a list, not text or a number: \['a'\]"
    ):
        run(src(f, text_template=template), tmp_path)
    report, texts = run(src(f, text_template=template, on_bad_rows="skip"), tmp_path)
    assert texts == ["Q / Score: 3", "Q / Score: 0.5", " / Score: 1", "Q / Score: "]
    assert report["dropped"] == {"not_text": 3}

    with pytest.raises(DataError, match=r"t\.jsonl:5: source\.text_template field 'score' holds a bool"):
        write_jsonl(f, [{"q": "Q", "score": 1}] * 4 + [{"q": "Q", "score": False}])
        run(src(f, text_template=template), tmp_path)


def test_template_may_index_into_lists_and_dicts(tmp_path):
    f = write_jsonl(
        tmp_path / "c.jsonl",
        [
            {"turns": ["hi", "yo"], "meta": {"title": "T"}},
            {"turns": [["x"]], "meta": {"title": "T"}},
            {"turns": ["a"], "meta": {"title": None}},
        ],
    )
    template = "{turns[0]} -> {meta[title]}"
    with pytest.raises(DataError, match=r"c\.jsonl:2: source\.text_template field 'turns\[0\]' holds a list"):
        run(src(f, text_template=template), tmp_path)
    report, texts = run(src(f, text_template=template, on_bad_rows="skip"), tmp_path)
    assert texts == ["hi -> T", "a -> "] and report["dropped"] == {"not_text": 1}


def test_template_bytes_from_parquet_are_not_text(tmp_path):
    p = tmp_path / "b.parquet"
    pq.write_table(pa.table({"q": ["Q", "R"], "body": pa.array([b"x", None], pa.binary())}), p)
    with pytest.raises(
        DataError, match=r"b\.parquet:row 0: source\.text_template field 'body' holds bytes, not text or a number: b'x'"
    ):
        run(src(p, text_template="{q}: {body}"), tmp_path)
    report, texts = run(src(p, text_template="{q}: {body}", on_bad_rows="skip"), tmp_path)
    assert texts == ["R: "] and report["dropped"] == {"not_text": 1}


def test_txt_lines_end_at_newline_or_crlf_only(tmp_path):
    t = tmp_path / "odd.txt"
    t.write_bytes("one\r\npage\x0cbreak\r\nnel\x85here\nls\u2028ps\u2029end\n\ngs\x1dvt\x0b.\rcr\r\n".encode())
    report, texts = run(src(t), tmp_path)
    assert texts == ["one", "page\x0cbreak", "nel\x85here", "ls\u2028ps\u2029end", "", "gs\x1dvt\x0b.\rcr"]
    assert report["rows_in"] == 6  # the final \r\n ends the last line and starts no empty one

    t.write_bytes(b"no final newline\r\nlast")
    _, texts = run(src(t), tmp_path)
    assert texts == ["no final newline", "last"]


def test_txt_paragraphs_end_at_blank_lines_whatever_the_line_ending(tmp_path):
    t = tmp_path / "crlf.txt"
    t.write_bytes(b"p1 a\r\np1 b\r\n\r\np2\r\n \t\r\n\r\np3\x0cstill p3\n\n\n\np4\r\n")
    report, texts = run(src(t, txt_sample_by="paragraph"), tmp_path)
    assert texts == ["p1 a\r\np1 b", "p2", "p3\x0cstill p3", "p4\r\n"]
    assert report["rows_in"] == 4

    t.write_bytes("\n\n \n intro\u2028same paragraph\n\t\nnext\n\n  \n".encode())
    _, texts = run(src(t, txt_sample_by="paragraph"), tmp_path)
    assert texts == [" intro\u2028same paragraph", "next"]  # whitespace-only pieces skipped


# -- a source that changes under convert -------------------------------------------------------------

CHANGED = (
    r"changed while convert was reading it \(its content no longer matches the fingerprint taken at the start\); "
    r"nothing was published"
)


def write_each_format(d, texts):
    """The same texts as one file of each local format; returns {format: path}."""
    d.mkdir(exist_ok=True)
    paths = {"jsonl": write_jsonl(d / "a.jsonl", [{"text": t} for t in texts])}
    (d / "b.json").write_text(json.dumps([{"text": t} for t in texts]))
    pq.write_table(pa.table({"text": texts}), d / "c.parquet")
    (d / "e.csv").write_text("text\n" + "".join(f"{t}\n" for t in texts))
    (d / "f.txt").write_text("".join(f"{t}\n" for t in texts))
    paths.update(json=d / "b.json", parquet=d / "c.parquet", csv=d / "e.csv", txt=d / "f.txt")
    return paths


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "csv", "txt"])
def test_file_changed_after_the_fingerprint_is_refused(tmp_path, kind):
    path = write_each_format(tmp_path / "d", ["one", "two"])[kind]
    source = src(path)
    taken = source_fingerprint(source)
    write_each_format(tmp_path / "d", ["one", "two", "three"])
    out = tmp_path / "out"
    with pytest.raises(
        DataError, match=rf"^source file {path} {CHANGED} — rerun when the file is no longer being written$"
    ):
        run(source, tmp_path, source_fp=taken)
    assert not (out / "state.json").exists() and not (out / "dataset_info.json").exists()
    report, texts = run(source, tmp_path)  # a fresh fingerprint describes the new bytes
    assert texts == ["one", "two", "three"] and report["rows_out"] == 3


@contextlib.contextmanager
def on_first_skip(change):
    """Run `change()` once, when convert logs its first skipped bad row: a point in the middle of
    reading a file, reached the same way every run."""

    class Handler(logging.Handler):
        calls = 0

        def emit(self, record):
            if record.getMessage().startswith("skipping") and not Handler.calls:
                Handler.calls += 1
                change()

    logger = logging.getLogger("moai.stages.convert")
    handler, level = Handler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert Handler.calls == 1, "the change never ran: no bad row was skipped"


def append_rows(path, rows):
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_rows_appended_while_reading_are_refused(tmp_path):
    f = write_jsonl(
        tmp_path / "data.jsonl", [{"text": "a"}, {"body": "no text"}] + [{"text": f"r{i}"} for i in range(50)]
    )
    source = src(f, on_bad_rows="skip")
    taken = source_fingerprint(source)
    with (
        on_first_skip(lambda: append_rows(f, [{"text": "late"}] * 10)),
        pytest.raises(DataError, match=rf"^source file {f} {CHANGED}"),
    ):
        run(source, tmp_path, source_fp=taken)
    assert not (tmp_path / "out" / "state.json").exists()


def test_parquet_touched_while_reading_is_refused(tmp_path):
    # Parquet is read by random access and hashed again after: same bytes, but the file was
    # written meanwhile (its mtime moved), so what was read cannot be vouched for.
    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": pa.array([["a"], ["b"], None], pa.list_(pa.string()))}), p)
    source = src(p, on_bad_rows="skip")
    taken = source_fingerprint(source)
    st = os.stat(p)
    with (
        on_first_skip(lambda: os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))),
        pytest.raises(DataError, match=rf"^source file {p} {CHANGED}"),
    ):
        run(source, tmp_path, source_fp=taken)
    assert source_fingerprint(source) == taken  # the bytes are the same; the stat is what moved


def test_a_file_added_after_the_fingerprint_is_named(tmp_path):
    d = tmp_path / "d"
    write_jsonl(d / "a.jsonl", [{"text": "one"}])
    source = src(d / "*.jsonl")
    taken = source_fingerprint(source)
    write_jsonl(d / "b.jsonl", [{"text": "two"}])
    with pytest.raises(
        DataError,
        match=rf"matched 1 file\(s\) at the start and 2 when convert read them "
        rf"\(new: \['{d / 'b.jsonl'}'\]; gone: none\); nothing was published",
    ):
        run(source, tmp_path, source_fp=taken)


@pytest.mark.slow
def test_a_fingerprint_from_another_process_still_guards(tmp_path):
    # A Prefect task may take the fingerprint in another process: the change is still caught,
    # though which of several files changed cannot be told.
    d = tmp_path / "d"
    write_jsonl(d / "a.jsonl", [{"text": "one"}])
    write_jsonl(d / "b.jsonl", [{"text": "two"}])
    source = src(d / "*.jsonl")
    done = run_offline(
        "from moai.config import parse_config\n"
        "from moai.stages.convert import source_fingerprint\n"
        f"cfg = parse_config({{'source': {{'path': {str(d / '*.jsonl')!r}}}, 'tokenizer': {{'path': 't'}}}})\n"
        "print(source_fingerprint(cfg.source))\n",
        tmp_path,
    )
    taken = done.stdout.strip()
    assert done.returncode == 0 and taken.startswith("files:")
    report, _ = run(source, tmp_path, source_fp=taken)  # the same bytes give the same fingerprint anywhere
    assert report["rows_out"] == 2
    append_rows(d / "b.jsonl", [{"text": "three"}])
    with pytest.raises(DataError, match=r"one of its 2 files changed while convert was reading them"):
        run(source, tmp_path, source_fp=taken)


def test_pipeline_publishes_nothing_when_the_source_changes_during_convert(tmp_path):
    # The issue: rows appended during a cold run, the file restored, a rerun said "reused" and
    # served documents the file does not have.
    f = write_jsonl(
        tmp_path / "data.jsonl", [{"text": "doc 0"}, {"body": "no text"}] + [{"text": f"doc {i}"} for i in range(1, 40)]
    )
    original = f.read_bytes()
    cfg = parse_config(config_dict(tmp_path, f, {"path": "unused"}, source={"on_bad_rows": "skip"}))
    taken = pipeline.ROOTS["source"](cfg)
    with (
        on_first_skip(lambda: append_rows(f, [{"text": "extra"}] * 5)),
        pytest.raises(DataError, match=rf"^source file {f} {CHANGED}"),
    ):
        pipeline.run_stage(cfg, "convert", {"source": taken}, progress=False)
    convert_dir = tmp_path / "cache" / "convert"
    assert not pipeline.is_published(cfg, "convert", {"source": taken})
    assert [p.name for p in convert_dir.iterdir() if not p.name.endswith(".lock")] == []  # no folder, no leftover

    f.write_bytes(original)
    rerun = pipeline.run_stage(cfg, "convert", {"source": pipeline.ROOTS["source"](cfg)}, progress=False)
    assert rerun.built and rerun.key == pipeline.key_of(cfg, "convert", {"source": taken})
    assert rerun.report["rows_out"] == 40 and rerun.report["dropped"] == {"missing_field": 1}


# -- an empty source, a lone surrogate, multi-line CSV fields, a literal path ---------------------------------


@pytest.mark.parametrize(
    "name, data, kw, why",
    [
        ("empty.jsonl", b"", {}, "the file is empty"),
        ("blank.jsonl", b"\n  \n\r\n", {}, "only blank lines"),
        ("empty.json", b"", {}, "the file is empty"),
        ("array.json", b" [ ]\n", {}, "no objects: an empty array or only blank lines"),
        ("empty.csv", b"", {}, "the file is empty"),
        ("header.csv", b"text,id\n", {}, "a header and no rows"),
        ("empty.txt", b"", {}, "the file is empty"),
        ("blank.txt", b"\n \n\t\n", {"txt_sample_by": "paragraph"}, "only blank lines"),
    ],
)
def test_a_source_without_rows_is_an_error_not_an_empty_output(tmp_path, name, data, kw, why):
    f = tmp_path / name
    f.write_bytes(data)
    with pytest.raises(DataError, match=rf"^convert: {f} gave 0 documents \({why}\); check source\.path$"):
        run(src(f, **kw), tmp_path)


def test_a_parquet_of_zero_rows_and_several_empty_files_are_named(tmp_path):
    p = tmp_path / "none.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), p)
    with pytest.raises(DataError, match=r"none\.parquet gave 0 documents \(the table has 0 rows\)"):
        run(src(p), tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.jsonl").write_text("")
    (d / "b.jsonl").write_text("\n")
    with pytest.raises(
        DataError,
        match=rf"^convert: source\.path '{d}/\*' \(2 files\) gave 0 documents \({d}/a\.jsonl: the file is empty; "
        rf"{d}/b\.jsonl: only blank lines\); check source\.path$",
    ):
        run(src(d / "*"), tmp_path)
    # An empty file among others is no error: it adds no rows.
    write_jsonl(d / "c.jsonl", [{"text": "one"}])
    (d / "e.csv").write_text("")
    report, texts = run(src(d / "*"), tmp_path)
    assert texts == ["one"] and report["files"] == 4


def test_every_row_skipped_as_bad_is_an_error_with_the_counts(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": broken}\n{"body": "x"}\n[1]\n{"oops"\n')
    with pytest.raises(
        DataError,
        match=rf"^convert: {f} gave 0 documents: every one of its 4 rows was bad and skipped by "
        r"source\.on_bad_rows: skip \(bad_json: 2, missing_field: 1, not_an_object: 1\); fix the data",
    ):
        run(src(f, on_bad_rows="skip"), tmp_path)


def test_an_empty_source_publishes_nothing_and_fails_the_same_way_again(tmp_path):
    f = tmp_path / "data" / "empty.jsonl"
    f.parent.mkdir()
    f.write_bytes(b"")
    cfg = parse_config(config_dict(tmp_path, f, {"train": {"vocab_size": 300}}))
    message = rf"^convert: {f} gave 0 documents \(the file is empty\); check source\.path$"
    for _ in range(2):  # before, the rerun met the published empty output and failed inside datasets
        with pytest.raises(DataError, match=message):
            pipeline.prepare(cfg, progress=False)
        convert_dir = tmp_path / "cache" / "convert"
        assert [p.name for p in convert_dir.iterdir() if not p.name.startswith(".")] == []
        assert not (tmp_path / "cache" / "filter").exists()


def test_the_cli_says_an_empty_source_in_one_line(tmp_path, capsys):
    from moai import cli

    f = tmp_path / "empty.jsonl"
    f.write_bytes(b"")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config_dict(tmp_path, f, {"train": {"vocab_size": 300}})))
    assert cli.main(["prepare", str(cfg), "--no-progress"]) == 2
    # decided from the file size before any stage runs (preflight), the one line on stderr
    assert capsys.readouterr().err.splitlines() == [
        f"moai: error: source.path {f} is empty (0 bytes): there is nothing to convert; check source.path"
    ]


def test_a_lone_surrogate_is_a_bad_row(tmp_path):
    # "\ud800" is valid JSON that json.loads turns into a str no UTF-8 can hold; pyarrow failed on it
    # with a UnicodeEncodeError naming no file, even with on_bad_rows: skip.
    f = tmp_path / "s.jsonl"
    f.write_text('{"text": "ok"}\n{"text": "a\\ud800b"}\n{"text": "pair \\ud83d\\ude00"}\n{"text": "\\udfff"}\n')
    with pytest.raises(
        DataError,
        match=r"^.*s\.jsonl:2: source\.text_field 'text' holds a lone surrogate \\ud800 \(a JSON escape without its "
        r"pair\): not valid Unicode \(set source\.on_bad_rows: skip",
    ):
        run(src(f), tmp_path)
    report, texts = run(src(f, on_bad_rows="skip"), tmp_path)
    assert texts == ["ok", "pair 😀"]  # an escaped pair is one character, and fine
    assert report["dropped"] == {"invalid_unicode": 2} and report["rows_in"] == 4 and report["rows_out"] == 2

    arr = tmp_path / "s.json"
    arr.write_text('[{"text": "ok"}, {"text": "\\uDBFF"}]')
    with pytest.raises(DataError, match=r"s\.json\[1\]: source\.text_field 'text' holds a lone surrogate \\udbff"):
        run(src(arr), tmp_path)
    report, texts = run(src(arr, on_bad_rows="skip"), tmp_path)
    assert texts == ["ok"] and report["dropped"] == {"invalid_unicode": 1}


def test_a_lone_surrogate_in_a_template_field_names_the_field(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"q": "Q", "a": "A", "unused": "\\ud800"}\n'
        '{"q": "Q", "a": "x\\udc00"}\n'
        '{"q": "Q", "a": "A", "turns": ["\\ud800"]}\n'
    )
    with pytest.raises(DataError, match=r"t\.jsonl:2: field 'a' \(in source\.text_template\) holds a lone surrogate"):
        run(src(f, text_template="{q}: {a}"), tmp_path)
    f.write_text('{"q": "Q", "turns": ["ok"]}\n{"q": "Q", "turns": ["\\ud800"]}\n{"q": "Q", "turns": ["ok"]}\n')
    with pytest.raises(DataError, match=r"t\.jsonl:2: the text of source\.text_template holds a lone surrogate"):
        run(src(f, text_template="{q}: {turns[0]}"), tmp_path)
    report, texts = run(src(f, text_template="{q}: {turns[0]}", on_bad_rows="skip"), tmp_path)
    assert texts == ["Q: ok", "Q: ok"] and report["dropped"] == {"invalid_unicode": 1}


def test_invalid_utf8_in_a_parquet_string_column_is_a_bad_row(tmp_path):
    # Parquet writers need not check UTF-8: to_pylist failed with a UnicodeDecodeError naming no file.
    p = tmp_path / "u.parquet"
    text = pa.array([b"ok", b"\xed\xa0\x80", b"caf\xe9", b"fine"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"text": text}), p)
    with pytest.raises(DataError, match=r"u\.parquet:row 1: invalid UTF-8 at byte 0 of a string column"):
        run(src(p), tmp_path)
    report, texts = run(src(p, on_bad_rows="skip"), tmp_path)
    assert texts == ["ok", "fine"] and report["dropped"] == {"invalid_utf8": 2} and report["rows_in"] == 4


def test_csv_fields_with_line_breaks_read_at_any_size(tmp_path):
    # pyarrow cut CSVs into 1 MiB blocks at bare newlines and failed past the first block
    # ("consider enabling the option 'newlines_in_values'").
    import csv
    import random

    rng = random.Random(0)
    words = ["data", "모델", "token", '"quoted"', "a,b", "🙂", " x "]
    breaks = ["\n", "\r\n", "\n\n", "\r\n\r\n", " "]
    f = tmp_path / "multi.csv"
    with open(f, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(["id", "text"])
        i = 0
        while out.tell() < 2_500_000:
            text = rng.choice(breaks).join(" ".join(rng.choices(words, k=rng.randint(1, 30))) for _ in range(3))
            writer.writerow([i, text])
            i += 1
    with open(f, newline="", encoding="utf-8") as inp:
        expected = [row["text"] for row in csv.DictReader(inp)]
    assert f.stat().st_size > 2 * 2**20 and any("\r\n" in t for t in expected)
    report, texts = run(src(f), tmp_path)
    assert report["rows_in"] == len(expected) == i
    assert list(texts) == expected


def test_a_path_naming_an_existing_file_is_not_read_as_a_glob(tmp_path):
    f = write_jsonl(tmp_path / "data[1].jsonl", [{"text": "literal"}])
    _, texts = run(src(f), tmp_path)
    assert texts == ["literal"]
    write_jsonl(tmp_path / "data1.jsonl", [{"text": "glob"}])
    _, texts = run(src(f), tmp_path)  # the existing file wins over what the glob would match
    assert texts == ["literal"]
    _, texts = run(src(tmp_path / "data[0-9].jsonl"), tmp_path)  # no such file: a glob
    assert texts == ["glob"]
