"""convert and filter: formats, templates, and every kind of bad input the issue lists."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import write_jsonl
from moai.config import parse_config
from moai.errors import DataError
from moai.stages.convert import convert
from moai.stages.filter import filter_text
from moai.textio import open_text


def src(path, **kw):
    return parse_config({"source": {"path": str(path), **kw}, "tokenizer": {"path": "t"}}).source


def run(source, tmp_path):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    report = convert(source, out, writer_batch_size=2, max_shard_size="1MB")
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


def test_offline_hub_error_names_dataset_and_local_way(tmp_path):
    from conftest import run_offline

    out = run_offline(
        "from moai.config import parse_config\n"
        "from moai.stages.convert import source_fingerprint\n"
        "source_fingerprint(parse_config({'source': {'hub': 'nobody/no-such-dataset-xyz'}, 'tokenizer': {'path': 't'}}).source)\n",
        tmp_path,
    )
    assert out.returncode != 0
    assert "DataError: cannot load hub dataset 'nobody/no-such-dataset-xyz'" in out.stderr
    assert "set source.path" in out.stderr


def test_filter_counts_each_reason(tmp_path):
    f = write_jsonl(tmp_path / "f.jsonl", [{"text": t} for t in ["", "   ", "ab", "abcd", "abcdefghijk", "abcde"]])
    conv = tmp_path / "conv"
    conv.mkdir()
    convert(src(f), conv, writer_batch_size=2, max_shard_size="1MB")
    out = tmp_path / "filt"
    out.mkdir()
    cfg = parse_config({"source": {"path": "x"}, "tokenizer": {"path": "t"},
                        "filter": {"min_chars": 3, "max_chars": 6}}).filter
    report = filter_text(cfg, conv, out, batch_size=4, max_shard_size="1MB")
    assert report["dropped"] == {"empty": 2, "too_short": 1, "too_long": 1}
    assert open_text(out)["text"] == ["abcd", "abcde"]


def test_everything_filtered_out_is_an_error(tmp_path):
    f = write_jsonl(tmp_path / "f.jsonl", [{"text": " "}, {"text": ""}])
    conv = tmp_path / "conv"
    conv.mkdir()
    convert(src(f), conv, writer_batch_size=2, max_shard_size="1MB")
    out = tmp_path / "filt"
    out.mkdir()
    cfg = parse_config({"source": {"path": "x"}, "tokenizer": {"path": "t"}}).filter
    with pytest.raises(DataError, match=r"every one of 2 rows was filtered out"):
        filter_text(cfg, conv, out, batch_size=4, max_shard_size="1MB")
