"""The `save_to_disk` folders moai writes itself (`moai.formats.text.DatasetWriter`): `datasets`
opens them, and their dataset_info.json is the one `datasets` would write, without importing it."""

import json
import subprocess
import sys

import datasets
import pyarrow as pa
import pytest

from moai.clean.rows import DROPPED_SCHEMA
from moai.formats.text import TEXT_SCHEMA, ColumnRows, DatasetWriter, features_dict, text_batch

PLAIN = [pa.string(), pa.large_string(), pa.binary(), pa.bool_(), pa.float32(), pa.float64()] + [
    getattr(pa, f"{kind}{bits}")() for kind in ("int", "uint") for bits in (8, 16, 32, 64)
]


@pytest.mark.parametrize("schema", [TEXT_SCHEMA, DROPPED_SCHEMA, pa.schema([(str(t), t) for t in PLAIN])], ids=str)
def test_features_are_what_datasets_gives(schema):
    assert features_dict(schema) == datasets.Features.from_arrow_schema(schema).to_dict()


def test_other_column_types_are_described_by_datasets_itself():
    schema = pa.schema([("ids", pa.list_(pa.int32())), ("meta", pa.struct([("a", pa.string())]))])
    assert features_dict(schema) == datasets.Features.from_arrow_schema(schema).to_dict()


def test_a_written_folder_opens_with_datasets_and_writing_it_imports_no_datasets(tmp_path):
    """Importing `datasets` took about 1 s of a cold `moai prepare`, in the middle of convert."""
    script = f"""
import sys
from pathlib import Path
from moai.formats.text import TEXT_SCHEMA, DatasetWriter, text_batch
with DatasetWriter(Path({str(tmp_path / "d")!r}), TEXT_SCHEMA, "1MB") as w:
    w.write(text_batch(["a", "bé", ""], [7, 8, 9]))
    print(w.finish())
print("datasets" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3", "False"]
    opened = datasets.load_from_disk(str(tmp_path / "d"))
    assert opened["text"] == ["a", "bé", ""] and opened["origin"] == [7, 8, 9]
    info = json.loads((tmp_path / "d" / "dataset_info.json").read_text())
    assert info["features"] == datasets.Features.from_arrow_schema(TEXT_SCHEMA).to_dict()


def test_a_folder_of_many_shards_keeps_every_row_in_order(tmp_path):
    texts = [f"document {i} " * 50 for i in range(2000)]
    with DatasetWriter(tmp_path / "d", TEXT_SCHEMA, 20_000) as w:
        for lo in range(0, len(texts), 100):
            w.write(text_batch(texts[lo : lo + 100], list(range(lo, lo + 100))))
        assert w.finish() == len(texts)
    state = json.loads((tmp_path / "d" / "state.json").read_text())
    assert len(state["_data_files"]) > 1
    opened = datasets.load_from_disk(str(tmp_path / "d"))
    assert opened["text"] == texts and opened["origin"] == list(range(len(texts)))


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()], ids=str)
def test_column_rows_give_each_rows_bytes_across_chunks_slices_and_nulls(kind):
    texts = [f"row {i} " + "é한" * (i % 5) if i % 7 else None for i in range(100)]
    chunks = [pa.array(texts[a:b], type=kind) for a, b in ((0, 30), (30, 31), (31, 31), (31, 100))]
    chunks[3] = pa.array([None, *texts[31:100]], type=kind).slice(1)  # a chunk with an offset
    column = pa.chunked_array(chunks, type=kind)
    rows = ColumnRows(column)
    for i, text in enumerate(texts):
        want = b"" if text is None else text.encode("utf-8")
        assert bytes(rows(i)) == want, i
    with pytest.raises(IndexError):
        rows(100)
