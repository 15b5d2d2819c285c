"""convert of compressed files: every text format × every codec gives the documents of the plain
file byte for byte, the fingerprint is of the compressed bytes, and bad or misnamed compressed
files are one line that names the file and the fix."""

import bz2
import gzip
import json
import lzma
import sys

import pytest
import zstandard

from conftest import write_jsonl
from moai import preflight
from moai.config import parse_config
from moai.errors import DataError
from moai.formats.text import open_text
from moai.stages.convert import convert, readers, source_files, source_fingerprint
from moai.stages.convert.compressed import sniff, text_bytes
from moai.stages.convert.fingerprint import digest_file, files_fingerprint

COMPRESS = {
    ".gz": gzip.compress,
    ".zst": lambda data: zstandard.ZstdCompressor(level=3).compress(data),
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
}
# Texts that a codec or a line reader could get wrong: multi-byte UTF-8, \r\n, a form feed and
# U+2028 inside a line, a quoted CSV field with a line break, an empty text.
TEXTS = ["one", "두 번째 문서", "three\r\nwith crlf", "page\x0cbreak\u2028kept", "", 'quote " and, comma\nnewline']


def src(path, **kw):
    return parse_config({"source": {"path": str(path), **kw}, "tokenizer": {"path": "t"}}).source


def run(source, out):
    out.mkdir()
    report = convert(source, out, source_fp=source_fingerprint(source), writer_batch_size=2, max_shard_size="1MB")
    return report, open_text(out)["text"]


@pytest.fixture(params=["parser", "thread"])
def decompressed_by(request, monkeypatch):
    """zstd and gzip files of 1 MiB and more are decompressed by a thread beside the parser: every
    file here is, in the "thread" case."""
    if request.param == "thread":
        monkeypatch.setattr(readers, "AHEAD_MIN_BYTES", 0)
    return request.param


def plain_file(folder, kind):
    """A plain file of format `kind` holding TEXTS (txt: one per paragraph)."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        return write_jsonl(folder / "d.jsonl", [{"text": t, "n": i} for i, t in enumerate(TEXTS)])
    if kind == "json":
        path = folder / "d.json"
        path.write_text(json.dumps([{"text": t} for t in TEXTS], ensure_ascii=False), encoding="utf-8")
        return path
    if kind == "csv":
        import pyarrow as pa
        import pyarrow.csv as pcsv

        path = folder / "d.csv"
        pcsv.write_csv(pa.table({"text": TEXTS, "n": list(range(len(TEXTS)))}), path)
        return path
    path = folder / "d.txt"
    path.write_bytes("\n\n".join(t for t in TEXTS if t.strip()).encode())
    return path


@pytest.mark.parametrize("suffix", list(COMPRESS))
@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "txt"])
def test_every_format_and_codec_gives_the_plain_files_documents(tmp_path, kind, suffix, decompressed_by):
    plain = plain_file(tmp_path / "plain", kind)
    packed = tmp_path / "packed" / (plain.name + suffix)
    packed.parent.mkdir()
    packed.write_bytes(COMPRESS[suffix](plain.read_bytes()))
    extra = {"txt_sample_by": "paragraph"} if kind == "txt" else {}
    plain_report, plain_texts = run(src(plain, **extra), tmp_path / "out-plain")
    report, texts = run(src(packed, **extra), tmp_path / "out-packed")
    assert [t.encode() for t in texts] == [t.encode() for t in plain_texts]
    assert len(texts) >= 5 and report["rows_in"] == plain_report["rows_in"]
    # the fingerprint is of the compressed bytes as stored, the same digest as any file's
    assert source_fingerprint(src(packed, **extra)) == files_fingerprint([digest_file(packed)])
    assert report["mb_in"] == round(packed.stat().st_size / 1e6, 3)  # the source files' bytes, as read


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_a_compressed_file_under_a_plain_name_is_read_by_its_magic_number(tmp_path, suffix):
    plain = plain_file(tmp_path / "plain", "jsonl")
    hidden = tmp_path / "hidden" / "d.jsonl"  # compressed bytes, plain name: never "invalid UTF-8"
    hidden.parent.mkdir()
    hidden.write_bytes(COMPRESS[suffix](plain.read_bytes()))
    _, texts = run(src(hidden), tmp_path / "out")
    _, plain_texts = run(src(plain), tmp_path / "out-plain")
    assert texts == plain_texts


def test_several_frames_and_members_are_one_stream(tmp_path, decompressed_by):
    rows = [{"text": f"doc {i}"} for i in range(6)]
    halves = [("".join(json.dumps(r) + "\n" for r in part)).encode() for part in (rows[:3], rows[3:])]
    zst = tmp_path / "frames.jsonl.zst"
    zst.write_bytes(b"".join(zstandard.ZstdCompressor().compress(h) for h in halves))
    gz = tmp_path / "members.jsonl.gz"
    gz.write_bytes(b"".join(gzip.compress(h) for h in halves))
    for path in (zst, gz):
        _, texts = run(src(path), tmp_path / path.name.replace(".", "-"))
        assert texts == [r["text"] for r in rows]


def test_a_name_that_promises_another_codec_is_one_line(tmp_path):
    plain = plain_file(tmp_path, "jsonl")
    named_gz = tmp_path / "x.jsonl.gz"
    named_gz.write_bytes(plain.read_bytes())
    with pytest.raises(DataError, match=r"x\.jsonl\.gz: named \.gz \(gzip\) but its bytes are not compressed"):
        run(src(named_gz), tmp_path / "o1")
    zst_as_gz = tmp_path / "y.jsonl.gz"
    zst_as_gz.write_bytes(COMPRESS[".zst"](plain.read_bytes()))
    with pytest.raises(DataError, match=r"its bytes are zstd data.*rename it to match its content \(y\.jsonl\.zst\)"):
        run(src(zst_as_gz), tmp_path / "o2")


@pytest.mark.parametrize("suffix", list(COMPRESS))
def test_a_truncated_file_names_the_codec_and_the_check(tmp_path, suffix, decompressed_by):
    data = "".join(json.dumps({"text": f"document number {i} " * 20}) + "\n" for i in range(2000)).encode()
    whole = COMPRESS[suffix](data)
    cut = tmp_path / f"cut.jsonl{suffix}"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"cut\.jsonl\.\w+: cannot decompress its \w+ data .* truncated or corrupt; "):
        run(src(cut), tmp_path / "out")


@pytest.mark.parametrize("suffix", [".zst", ".gz"])
def test_a_large_shard_is_decompressed_beside_the_parser_and_a_bad_row_stops_that_thread(tmp_path, suffix):
    import os
    import threading

    # 16 MB of text, ~9 MB compressed: more than the thread's three 4 MiB buffers hold, so it is
    # still at work (waiting for a buffer) when the parser stops at the bad row
    lines = [json.dumps({"text": os.urandom(600).hex()}) for _ in range(13_000)]
    lines[12_000] = "{not json"
    path = tmp_path / f"big.jsonl{suffix}"
    path.write_bytes(COMPRESS[suffix]("\n".join(lines).encode()))
    assert path.stat().st_size >= readers.AHEAD_MIN_BYTES
    source = src(path)
    (file,) = source_files(source)
    rows = readers.file_rows(file, source, readers.Rows(source), [])
    assert json.loads(lines[0]) == next(rows)[1]

    def decompressing():
        return [t for t in threading.enumerate() if t.name == "moai-decompress"]

    assert len(decompressing()) == 1
    with pytest.raises(DataError, match=rf"big\.jsonl\{suffix}:12001: malformed JSON"):
        for _ in rows:
            pass
    assert decompressing() == []  # stopped and joined before the file was closed


def test_a_file_changed_after_its_fingerprint_is_refused(tmp_path):
    path = tmp_path / "d.jsonl.zst"
    path.write_bytes(COMPRESS[".zst"](b'{"text": "before"}\n'))
    source = src(path)
    fp = source_fingerprint(source)
    path.write_bytes(COMPRESS[".zst"](b'{"text": "after!"}\n'))
    (tmp_path / "out").mkdir()
    with pytest.raises(DataError, match=r"changed while convert was reading it"):
        convert(source, tmp_path / "out", source_fp=fp, writer_batch_size=2, max_shard_size="1MB")


def test_globs_pick_compressed_shards_and_parquet_inside_a_codec_is_refused(tmp_path):
    for i in range(3):
        (tmp_path / f"s{i}.jsonl.zst").write_bytes(COMPRESS[".zst"](json.dumps({"text": str(i)}).encode() + b"\n"))
    assert [p.name for p in source_files(src(tmp_path / "*.jsonl.zst"))] == [
        "s0.jsonl.zst",
        "s1.jsonl.zst",
        "s2.jsonl.zst",
    ]
    (tmp_path / "t.parquet.gz").write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(DataError, match=r"compressed parquet file; parquet compresses its own columns"):
        source_files(src(tmp_path / "t.parquet.gz"))
    with pytest.raises(DataError, match=r"cannot read .*\.tar.*supported: .*compressed \(\.gz, \.zst, \.bz2, \.xz\)"):
        (tmp_path / "a.tar").write_bytes(b"x")
        source_files(src(tmp_path / "a.tar"))


def test_binary_formats_moai_does_not_read_are_named(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "z.jsonl", "w") as z:
        z.writestr("inner.jsonl", '{"text": "x"}\n')
    with pytest.raises(DataError, match=r"z\.jsonl: its bytes are a zip archive .*not text: unzip it"):
        run(src(tmp_path / "z.jsonl"), tmp_path / "o1")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "p.jsonl")
    with pytest.raises(DataError, match=r"p\.jsonl: its bytes are a parquet file .*name it \.parquet"):
        run(src(tmp_path / "p.jsonl"), tmp_path / "o2")


def test_magic_numbers_are_not_mistaken_for_text():
    assert sniff(b"BZh is how this line starts") is None  # bzip2 needs its block magic too
    assert sniff(bz2.compress(b"x")[:16]) == "bzip2" and sniff(bz2.compress(b"")[:16]) == "bzip2"
    assert sniff(b'{"text": "x"}') is None and sniff(b"") is None
    pzstd_skippable = b"\x50\x2a\x4d\x18" + b"\x04\x00\x00\x00"
    assert sniff(pzstd_skippable) == "zstd"


def test_plan_accepts_compressed_shards_and_estimates_their_text(tmp_path):
    text = "".join(json.dumps({"text": "the same words again " * 10}) + "\n" for _ in range(5000)).encode()
    shard = tmp_path / "s.jsonl.gz"
    shard.write_bytes(gzip.compress(text))
    cfg = {"cache_dir": str(tmp_path / "cache"), "source": {"path": str(shard)}, "tokenizer": {"path": "t"}}
    facts = preflight.gather(parse_config(cfg), tokenizer=False, train=False)
    assert "source" not in facts.errors
    # the estimate is of the text, within 10%, not of the ~100x smaller compressed file
    assert abs(facts.corpus_bytes - len(text)) < 0.1 * len(text)
    assert text_bytes([shard]) == facts.corpus_bytes


def test_a_zstd_stream_cut_anywhere_is_an_error_and_whole_it_is_read():
    """Frames with and without checksums and content sizes, an RLE block, a skippable frame: the
    whole stream reads back; cut at any byte, it raises what convert names as truncated."""
    import io

    from moai.stages.convert.compressed import decompress_errors, decompressing

    texts = [b"a" * 3000, b"plain words, not repeated: 1 2 3 4 5 6 7 8 9", b""]
    frames = [
        zstandard.ZstdCompressor(write_checksum=True).compress(texts[0]),  # an RLE block
        b"\x5a\x2a\x4d\x18" + (5).to_bytes(4, "little") + b"skip!",  # a skippable frame
        zstandard.ZstdCompressor(write_content_size=False).compress(texts[1]),
        zstandard.ZstdCompressor().compress(texts[2]),
    ]
    whole = b"".join(frames)
    assert decompressing(io.BytesIO(whole), "zstd").read() == b"".join(texts)
    frame_ends = {sum(len(f) for f in frames[: i + 1]) for i in range(len(frames))}
    for cut in range(1, len(whole)):
        if cut in frame_ends:  # a stream of whole frames is a shorter, valid stream
            continue
        with pytest.raises(decompress_errors()):
            decompressing(io.BytesIO(whole[:cut]), "zstd").read()


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
def test_rows_closed_early_are_not_taken_for_a_decompression_error(tmp_path, monkeypatch, name):
    """A convert stopped by a refused row closes its reader early (at interpreter exit, when its
    generator is collected). That must not import the decompressors to match their errors: at
    exit the import fails and printed an "Exception ignored" traceback after the one-line error."""
    data = b"".join(json.dumps({"text": f"row {i}"}).encode() + b"\n" for i in range(100))
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    source = src(tmp_path / name)
    (path,) = source_files(source)
    rows = readers.file_rows(path, source, readers.Rows(source), [])
    assert next(rows)[1]["text"] == "row 0"
    for module in ("zstandard", "isal"):
        monkeypatch.setitem(sys.modules, module, None)  # any import of them now fails
    rows.close()
