"""Sources in object storage, against a real S3 server (SeaweedFS on loopback, tests/s3_server.py) and,
where a test takes `bucket`, a real GCS server too (fake-gcs-server on loopback, tests/gcs_server.py),
and hf:// against a real Hub API (olah on loopback, tests/hf_server.py):
the same documents and tokens as the local files, fingerprints from the listing, a changed object
refused, credentials only from the environment and never written down, and failures in seconds."""

import gzip
import hashlib
import json
import re
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard

from conftest import config_dict, make_texts, moai_cli, store_files, write_jsonl
from moai.config import parse_config
from moai.errors import DataError, MoaiError
from moai.formats.text import open_text
from moai.remote import is_url, secret_keys
from moai.stages.convert import convert, source_files, source_fingerprint

pytestmark = pytest.mark.slow  # real S3, GCS and Hub servers (started once a session)


def shards(tmp_path, n=3, per=400):
    """n plain .jsonl shards of real-looking text, and the same shards compressed (zst, gz)."""
    texts = make_texts(n * per, seed=11)
    plain = []
    for i in range(n):
        plain.append(
            write_jsonl(tmp_path / "plain" / f"s{i}.jsonl", [{"text": t} for t in texts[i * per : (i + 1) * per]])
        )
    return plain


def upload(bucket, files, prefix, compress=None):
    fs = bucket.server.fs()
    for f in files:
        data = f.read_bytes()
        name = f.name
        if compress == "zst":
            data, name = zstandard.ZstdCompressor().compress(data), name + ".zst"
        elif compress == "gz":
            data, name = gzip.compress(data), name + ".gz"
        fs.pipe(f"{bucket.name}/{prefix}/{name}", data)


def src(path, server=None, **kw):
    """The source of `path`, with the storage_options of `server` (a test server or a `bucket`)."""
    options = {"storage_options": server.options} if server else {}
    return parse_config({"source": {"path": str(path), **options, **kw}, "tokenizer": {"path": "t"}}).source


def texts_of(source, out, source_fp=None):
    out.mkdir()
    fp = source_fingerprint(source) if source_fp is None else source_fp
    convert(source, out, source_fp=fp, writer_batch_size=100, max_shard_size="1MB")
    return open_text(out)["text"]


def test_a_glob_of_compressed_shards_in_a_bucket_gives_the_local_documents(tmp_path, bucket):
    plain = shards(tmp_path)
    upload(bucket, plain, "zst", compress="zst")
    upload(bucket, plain, "gz", compress="gz")
    local = texts_of(src(tmp_path / "plain" / "*.jsonl"), tmp_path / "local")
    for codec in ("zst", "gz"):
        remote = src(bucket.url(f"{codec}/*.jsonl.{codec}"), bucket)
        assert [str(o) for o in source_files(remote)] == [bucket.url(f"{codec}/s{i}.jsonl.{codec}") for i in range(3)]
        assert texts_of(remote, tmp_path / f"out-{codec}") == local


def test_parquet_in_s3(tmp_path, s3_server, s3_bucket):
    texts = make_texts(300, seed=4)
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet", row_group_size=50)
    s3_server.fs().put_file(str(tmp_path / "t.parquet"), f"{s3_bucket}/p/t.parquet")
    assert texts_of(src(f"s3://{s3_bucket}/p/*.parquet", s3_server), tmp_path / "out") == texts


def test_the_fingerprint_is_the_listings_and_an_object_changed_before_reading_is_refused(tmp_path, bucket):
    fs = bucket.server.fs()
    fs.pipe(f"{bucket.name}/c/a.jsonl", b'{"text": "before"}\n')
    source = src(bucket.url("c/a.jsonl"), bucket)
    fp = source_fingerprint(source)
    assert fp == source_fingerprint(source)  # listed again, unchanged: the same key
    # the listing's MD5 (S3: a single-part ETag; GCS: md5Hash), which the bytes read are checked against
    (obj,) = source_files(source)
    assert obj.md5() == hashlib.md5(b'{"text": "before"}\n').hexdigest()
    fs.pipe(f"{bucket.name}/c/a.jsonl", b'{"text": "after!"}\n')  # same size, other bytes, ETag and generation
    assert source_fingerprint(source) != fp
    url = re.escape(bucket.url("c/a.jsonl"))
    with pytest.raises(DataError, match=rf"{url} changed while convert was reading it"):
        texts_of(source, tmp_path / "out", source_fp=fp)


def test_prepare_from_a_bucket_writes_the_local_token_store_and_no_secret(tmp_path, bucket, tokenizer_dir):
    plain = shards(tmp_path)
    upload(bucket, plain, "corpus", compress="zst")
    tok = {"path": str(tokenizer_dir)}
    local_cfg = config_dict(tmp_path, tmp_path / "plain" / "*.jsonl", tok, cache_dir=str(tmp_path / "local"))
    remote_cfg = config_dict(tmp_path, bucket.url("corpus/*.jsonl.zst"), tok, cache_dir=str(tmp_path / "remote"))
    remote_cfg["source"]["storage_options"] = bucket.options
    # one object at a time (the default fetches 4 at once): the same token store, byte for byte
    one_cfg = {
        **remote_cfg,
        "cache_dir": str(tmp_path / "one"),
        "source": {**remote_cfg["source"], "num_parallel_reads": 1},
    }
    outputs = []
    for name, cfg in (("local", local_cfg), ("remote", remote_cfg), ("one", one_cfg)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        run = moai_cli("prepare", f"{name}.yaml", "-v", cwd=tmp_path, env=bucket.server.env())
        assert run.returncode == 0, run.stderr[-3000:]
        outputs.append(run.stdout + run.stderr)
    # the same ids, boundaries and rows; only where the rows came from (origins.json) names other files
    local, remote = store_files(tmp_path / "local" / "tokenize"), store_files(tmp_path / "remote" / "tokenize")
    assert {p.name for p in local} == {p.name for p in remote}
    local_tokens = sorted(v for p, v in local.items() if p.name != "origins.json")
    assert len(local_tokens) > 1 and local_tokens == sorted(v for p, v in remote.items() if p.name != "origins.json")
    assert store_files(tmp_path / "one" / "tokenize") == remote
    (origins,) = [json.loads(v) for p, v in remote.items() if p.name == "origins.json"]
    assert origins["files"] == [bucket.url(f"corpus/s{i}.jsonl.zst") for i in range(3)]
    if bucket.scheme == "s3":  # the GCS emulator takes no credentials: nothing secret to look for
        secret = bucket.server.secret.encode()
        written = [p for p in (tmp_path / "remote").rglob("*") if p.is_file() and secret in p.read_bytes()]
        assert written == [] and bucket.server.secret not in outputs[1]
        assert bucket.server.secret not in (tmp_path / "remote.yaml").read_text()


def test_credentials_in_a_config_are_refused():
    with pytest.raises(ValueError, match=r"source\.storage_options\.secret: credentials do not go in a config"):
        parse_config(
            {"source": {"path": "s3://b/x.jsonl", "storage_options": {"secret": "s"}}, "tokenizer": {"path": "t"}}
        )
    assert secret_keys({"client_kwargs": {"aws_secret_access_key": "s"}}, "o") == [
        "o.client_kwargs.aws_secret_access_key"
    ]
    # gcsfs's `token: anon` (no credentials: a public bucket, an emulator) is no secret; any other token is
    assert secret_keys({"token": "anon", "endpoint_url": "http://127.0.0.1:4443"}, "o") == []
    assert secret_keys({"token": "ya29.a0AfH6"}, "o") == ["o.token"]
    assert is_url("s3://b/k") and is_url("gs://b/k") and not is_url("/data/x.jsonl") and not is_url("file:///x")


def one_line_in_seconds(source, match):
    started = time.monotonic()
    with pytest.raises(MoaiError, match=match) as info:
        source_files(source)
    assert time.monotonic() - started < 15
    assert "\n" not in str(info.value)
    return str(info.value)


def test_wrong_credentials_a_missing_bucket_and_no_server_are_one_line_in_seconds(s3_server, s3_bucket, monkeypatch):
    s3_server.fs().pipe(f"{s3_bucket}/k/a.jsonl", b'{"text": "x"}\n')
    url = f"s3://{s3_bucket}/k/*.jsonl"
    assert len(source_files(src(url, s3_server))) == 1
    for missing in (f"s3://no-such-bucket-{s3_bucket}/k/a.jsonl", f"s3://no-such-bucket-{s3_bucket}/k/*.jsonl"):
        one_line_in_seconds(src(missing, s3_server), r"bucket does not exist: create it")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    denied = rf"cannot read {re.escape(url)}: access denied .*check the credentials"
    line = one_line_in_seconds(src(url, s3_server), denied)
    assert "wrong" not in line
    from s3_server import _free_ports

    (closed,) = _free_ports(1)
    gone = parse_config(
        {
            "source": {"path": url, "storage_options": {"endpoint_url": f"http://127.0.0.1:{closed}"}},
            "tokenizer": {"path": "t"},
        }
    ).source
    one_line_in_seconds(gone, r"cannot reach the endpoint .*check storage_options\.endpoint_url")


def test_a_missing_gcs_bucket_is_one_line_in_seconds(gcs_server):
    for missing in ("gs://no-such-bucket/k/a.jsonl", "gs://no-such-bucket/k/*.jsonl"):
        line = one_line_in_seconds(
            src(missing, gcs_server),
            r"the bucket does not exist: create it \(gcloud storage buckets create gs://no-such",
        )
        assert line.startswith(f"cannot read {missing}: ")


def test_json_of_the_listing_is_stable(tmp_path, s3_server, s3_bucket):
    """Two listings of the same objects give the same fingerprint, whatever order the server lists."""
    fs = s3_server.fs()
    for i in (2, 0, 1):
        fs.pipe(f"{s3_bucket}/o/{i}.jsonl", json.dumps({"text": str(i)}).encode() + b"\n")
    source = src(f"s3://{s3_bucket}/o/*.jsonl", s3_server)
    assert texts_of(source, tmp_path / "out") == ["0", "1", "2"]


@pytest.fixture
def http_folder(tmp_path):
    """A folder served over HTTP on loopback: the standard library's server in a process of its
    own (`python -m http.server`), stopped by its pid."""
    import subprocess
    import sys
    import urllib.request

    from s3_server import _free_ports

    folder = tmp_path / "www"
    folder.mkdir()
    (port,) = _free_ports(1)
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(base, timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"python -m http.server did not answer on {base}")
                time.sleep(0.1)
        yield folder, base
    finally:
        server.terminate()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)


def test_an_https_style_url_without_etag_is_fingerprinted_by_its_bytes(tmp_path, http_folder):
    folder, base = http_folder
    plain = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(200, seed=5)])
    (folder / "d.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    source = src(f"{base}/d.jsonl.gz")
    fp = source_fingerprint(source)
    assert fp == source_fingerprint(src(folder / "d.jsonl.gz"))  # no ETag: the bytes, as for a local file
    assert texts_of(source, tmp_path / "out") == texts_of(src(plain), tmp_path / "plain")
    (folder / "d.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes() + b'{"text": "one more"}\n'))
    with pytest.raises(DataError, match=r"d\.jsonl\.gz changed while convert was reading it"):
        texts_of(source, tmp_path / "out2", source_fp=fp)


def test_a_glob_over_http_reads_the_links_of_the_directory_page(tmp_path, http_folder):
    """fsspec's HTTP filesystem globs by the links of a directory's HTML page (what `python -m
    http.server`, nginx autoindex and similar serve); the objects are fetched ahead in parallel."""
    folder, base = http_folder
    plain = shards(tmp_path)
    (folder / "shards").mkdir()
    for f in plain:
        (folder / "shards" / f"{f.name}.gz").write_bytes(gzip.compress(f.read_bytes()))
    source = src(f"{base}/shards/*.jsonl.gz")
    assert [str(o) for o in source_files(source)] == [f"{base}/shards/s{i}.jsonl.gz" for i in range(3)]
    # no ETag and no size in the listing: each object's bytes, as the same files on disk
    assert source_fingerprint(source) == source_fingerprint(src(folder / "shards" / "*.jsonl.gz"))
    assert texts_of(source, tmp_path / "out") == texts_of(src(tmp_path / "plain" / "*.jsonl"), tmp_path / "local")


def test_a_remote_object_streams_with_bounded_memory(tmp_path, s3_server, s3_bucket):
    """Reading the rows of a 48 MB object holds a few read-ahead blocks, not the object (tracemalloc's peak)."""
    import tracemalloc

    from moai.stages.convert.read_ahead import ReadAhead
    from moai.stages.convert.readers import Rows, file_rows

    line = json.dumps({"text": "x" * 1000}).encode() + b"\n"
    s3_server.fs().pipe(f"{s3_bucket}/big/a.jsonl.zst", zstandard.ZstdCompressor().compress(line * 48_000))
    s3_server.fs().pipe(f"{s3_bucket}/big/b.jsonl", line * 48_000)
    for name in ("a.jsonl.zst", "b.jsonl"):
        source = src(f"s3://{s3_bucket}/big/{name}", s3_server)
        (obj,) = source_files(source)
        rows, read = Rows(source), []
        tracemalloc.start()
        try:
            count = sum(1 for _ in file_rows(obj, source, rows, read))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert count == 48_000 and read[0].size == obj.size
        assert peak < 24e6, f"{name}: peak {peak / 1e6:.0f} MB while reading 48 MB of text"
    # two such objects fetched at once: a few chunks of each in flight, not the objects
    s3_server.fs().copy(f"{s3_bucket}/big/b.jsonl", f"{s3_bucket}/big/b2.jsonl")
    source = src(f"s3://{s3_bucket}/big/b*.jsonl", s3_server)
    objs, rows, read = source_files(source), Rows(source), []
    tracemalloc.start()
    try:
        with ReadAhead(objs, 2) as ahead:
            count = sum(1 for i, obj in enumerate(objs) for _ in file_rows(obj, source, rows, read, ahead.stream(i)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 2 * 48_000 and [r.size for r in read] == [o.size for o in objs]
    assert peak < 2 * 3 * 4.2e6 + 16e6, f"peak {peak / 1e6:.0f} MB while fetching 2 objects of 48 MB at once"


def test_a_response_cut_short_names_the_lost_server():
    """Which error a killed server gives depends on when it dies: refused connections, or (in the
    middle of a response) aiohttp's payload errors. Each is named as a lost server."""
    import aiohttp

    from moai.remote import explain

    for err in (
        aiohttp.ClientPayloadError(
            "Response payload is not completed: <ContentLengthError: 400, message='Not enough data to satisfy "
            "content length header (received 4194092 of 4194304 bytes).'>"
        ),
        aiohttp.ServerDisconnectedError("Server disconnected"),
        ConnectionRefusedError(111, "Connection refused"),
    ):
        message = str(explain("s3://b/a.jsonl.zst", err))
        assert message.startswith("cannot read s3://b/a.jsonl.zst: cannot reach the endpoint"), message
        assert "check storage_options.endpoint_url" in message


def test_a_server_lost_mid_read_is_named_as_such_not_as_a_corrupt_file(tmp_path, s3_server, s3_bucket):
    """Read by the parser's thread and fetched ahead by a thread of its own, alike."""
    import os

    from moai.stages.convert.read_ahead import ReadAhead
    from moai.stages.convert.readers import Rows, file_rows

    rows = [{"text": os.urandom(3000).hex()} for _ in range(6000)]  # ~36 MB that zstd shrinks to ~19 MB
    data = zstandard.ZstdCompressor().compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    assert len(data) > 4 * (1 << 22)  # more 4 MiB requests than the read-ahead holds
    s3_server.fs().pipe(f"{s3_bucket}/lost/a.jsonl.zst", data)
    source = src(f"s3://{s3_bucket}/lost/a.jsonl.zst", s3_server)
    objs = source_files(source)
    with ReadAhead(objs, 2) as ahead:
        readings = [
            file_rows(objs[0], source, Rows(source), []),
            file_rows(objs[0], source, Rows(source), [], ahead.stream(0)),
        ]
        for reading in readings:
            next(reading)
        s3_server.kill()
        try:
            for reading in readings:
                started = time.monotonic()
                with pytest.raises(
                    MoaiError, match=rf"cannot read s3://{s3_bucket}/lost/a\.jsonl\.zst: cannot reach the endpoint"
                ):
                    for _ in reading:
                        pass
                assert time.monotonic() - started < 15
        finally:
            s3_server.start()


def test_objects_fetched_in_parallel_give_the_sequential_output_byte_for_byte(tmp_path, s3_server, s3_bucket):
    """Objects of every codec and of varied sizes, read one after another and 4 at a time: the same
    files (text, origins, state), bytes for bytes; the read-ahead really has several in flight."""
    from moai.stages.convert.read_ahead import ReadAhead

    texts = make_texts(1500, seed=21)
    fs = s3_server.fs()
    start = 0
    for i in range(10):
        n = 20 + 37 * (i % 4)  # rows per object: 20 to 131
        data = "".join(json.dumps({"text": t}) + "\n" for t in texts[start : start + n]).encode()
        start += n
        suffix = ("", ".zst", ".gz")[i % 3]
        if suffix == ".zst":
            data = zstandard.ZstdCompressor().compress(data)
        elif suffix == ".gz":
            data = gzip.compress(data)
        fs.pipe(f"{s3_bucket}/par/part-{i:02d}.jsonl{suffix}", data)
    url = f"s3://{s3_bucket}/par/part-*"
    outputs = []
    for n in (1, 4):
        source = src(url, s3_server, num_parallel_reads=n)
        out = tmp_path / f"out{n}"
        assert texts_of(source, out) == texts[:start]
        outputs.append({p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()})
    assert outputs[0] == outputs[1] and len(outputs[0]) >= 3
    objs = source_files(src(url, s3_server))
    with ReadAhead(objs, 4) as ahead:
        ahead.stream(0)
        assert ahead.in_flight == 4
        ahead.stream(5)
        assert ahead.in_flight == 4
    assert ahead.in_flight == 0


def test_an_object_gone_before_its_read_is_one_line_fetched_ahead_or_not(tmp_path, s3_server, s3_bucket):
    from moai.stages.convert.read_ahead import ReadAhead
    from moai.stages.convert.readers import Rows, file_rows

    fs = s3_server.fs()
    for name in ("a", "b", "c"):
        fs.pipe(f"{s3_bucket}/gone/{name}.jsonl", json.dumps({"text": name}).encode() + b"\n")
    source = src(f"s3://{s3_bucket}/gone/*.jsonl", s3_server)
    objs = source_files(source)
    fs.rm(f"{s3_bucket}/gone/b.jsonl")  # listed, then gone before it is read
    for n in (1, 3):
        rows, texts = Rows(source), []
        with ReadAhead(objs, n) as ahead:
            with pytest.raises(MoaiError, match=rf"^cannot read s3://{s3_bucket}/gone/b\.jsonl: no such object"):
                for i, obj in enumerate(objs):
                    texts += [row["text"] for _, row in file_rows(obj, source, rows, [], ahead.stream(i))]
            assert ahead.in_flight == (0 if n == 1 else 2)  # b and c: c fetched, not read
        assert texts == ["a"]


def test_hf_a_glob_of_shards_gives_the_local_documents_fingerprinted_by_the_listing(tmp_path, hf_server):
    """hf:// against a real Hub API (olah, tests/hf_server.py): plain and zstd shards in a dataset
    repository; the fingerprint is the listing's (each file's git blob id and size), an object
    committed anew between the listing and the read is refused."""
    plain = shards(tmp_path)
    files = {f.name: f.read_bytes() for f in plain}
    files |= {f"zst/{f.name}.zst": zstandard.ZstdCompressor().compress(f.read_bytes()) for f in plain}
    root = hf_server.commit("glob", files)
    local = texts_of(src(tmp_path / "plain" / "*.jsonl"), tmp_path / "local")
    for pattern in ("*.jsonl", "zst/*.jsonl.zst"):
        remote = src(f"{root}/{pattern}", hf_server)
        objs = source_files(remote)
        assert [str(o) for o in objs] == [f"{root}/{pattern.replace('*', f's{i}')}" for i in range(3)]
        assert all(o.version and o.size > 0 for o in objs)
        assert texts_of(remote, tmp_path / f"out-{len(pattern)}") == local
    source = src(f"{root}/s0.jsonl", hf_server)
    fp = source_fingerprint(source)
    assert fp == source_fingerprint(source)
    hf_server.commit("glob", {"s0.jsonl": files["s0.jsonl"].replace(b"a", b"b", 1)})  # same size, other bytes
    assert source_fingerprint(source) != fp
    with pytest.raises(DataError, match=rf"{re.escape(root)}/s0\.jsonl changed while convert was reading it"):
        texts_of(source, tmp_path / "changed", source_fp=fp)


def test_hf_prepare_writes_the_local_token_store(tmp_path, hf_server, tokenizer_dir):
    plain = shards(tmp_path)
    files = {f.name: f.read_bytes() for f in plain[:2]}
    files[f"{plain[2].name}.zst"] = zstandard.ZstdCompressor().compress(plain[2].read_bytes())
    root = hf_server.commit("prepare", files)
    tok = {"path": str(tokenizer_dir)}
    (tmp_path / "mixed").mkdir()
    for name, data in files.items():  # the same files on disk
        (tmp_path / "mixed" / name).write_bytes(data)
    local_cfg = config_dict(tmp_path, tmp_path / "mixed" / "s*.jsonl*", tok, cache_dir=str(tmp_path / "local"))
    remote_cfg = config_dict(tmp_path, f"{root}/s*.jsonl*", tok, cache_dir=str(tmp_path / "remote"))
    remote_cfg["source"]["storage_options"] = hf_server.options
    for name, cfg in (("local", local_cfg), ("remote", remote_cfg)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        run = moai_cli("prepare", f"{name}.yaml", cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-3000:]
    local, remote = store_files(tmp_path / "local" / "tokenize"), store_files(tmp_path / "remote" / "tokenize")
    assert {p.name for p in local} == {p.name for p in remote}
    local_tokens = sorted(v for p, v in local.items() if p.name != "origins.json")
    assert len(local_tokens) > 1 and local_tokens == sorted(v for p, v in remote.items() if p.name != "origins.json")
    (origins,) = [json.loads(v) for p, v in remote.items() if p.name == "origins.json"]
    assert origins["files"] == [f"{root}/s0.jsonl", f"{root}/s1.jsonl", f"{root}/s2.jsonl.zst"]


def test_hf_a_missing_repository_is_one_line_in_seconds(tmp_path, hf_server, tokenizer_dir):
    for missing in ("hf://datasets/moai/no-such-repo@main/*.jsonl", "hf://datasets/moai/no-such-repo@main/a.jsonl"):
        line = one_line_in_seconds(src(missing, hf_server), r"no such repository or revision")
        assert line.startswith(f"cannot read {missing}: ")
    cfg = config_dict(tmp_path, "hf://datasets/moai/no-such-repo@main/*.jsonl", {"path": str(tokenizer_dir)})
    cfg["source"]["storage_options"] = hf_server.options
    (tmp_path / "missing.yaml").write_text(yaml.safe_dump(cfg))
    started = time.monotonic()
    run = moai_cli("prepare", "missing.yaml", cwd=tmp_path)
    assert run.returncode != 0 and time.monotonic() - started < 30
    errors = [line for line in run.stderr.splitlines() if line.startswith("moai: error:")]
    assert len(errors) == 1 and "hf://datasets/moai/no-such-repo@main/*.jsonl" in errors[0], run.stderr[-2000:]
