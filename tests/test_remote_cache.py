"""The remote cache against a real S3 server (SeaweedFS on loopback, tests/s3_server.py) and, where a
test takes `bucket` or names gs://, a real GCS server (fake-gcs-server on loopback, tests/gcs_server.py): two
machines (two cache folders) share every stage by key, uploads put the manifest last so a server
killed mid-upload leaves nothing visible, a corrupted remote object is refused on pull, and a
wrong key, a missing bucket or no server is one `moai: error:` line in seconds."""

import json
import time
from pathlib import Path

import pytest
import yaml

from conftest import config_dict, make_texts, moai_cli, store_files, write_jsonl
from moai import pipeline
from moai.config import parse_config
from moai.errors import CacheError, MoaiError
from moai.remote import _new_filesystem
from moai.remote_cache import RemoteCache, remote_of

pytestmark = pytest.mark.slow  # real S3 and GCS servers (started once a session)


def machine(tmp_path, name, corpus, tokenizer_dir, remote_url, server):
    """The config of one machine: its own cache folder, the shared remote cache on `server` (a test
    server or a `bucket`)."""
    cfg = config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}, cache_dir=str(tmp_path / name))
    if remote_url is not None:
        cfg["remote_cache"] = remote_url
        cfg["remote_cache_options"] = server.options
    return cfg


@pytest.fixture
def corpus(tmp_path):
    return write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in make_texts(1200, seed=21)])


def test_two_machines_share_every_stage_by_key(tmp_path, corpus, tokenizer_dir, bucket):
    url = bucket.url("cache")
    a = parse_config(machine(tmp_path, "a", corpus, tokenizer_dir, url, bucket))
    built = pipeline.walk(a)
    assert all(r.built for r in built.values())
    remote = remote_of(a)
    assert remote is not None
    assert {e.key for e in remote.entries()} == {r.key for r in built.values()}  # every stage uploaded

    b = parse_config(machine(tmp_path, "b", corpus, tokenizer_dir, url, bucket))
    pulled = pipeline.walk(b)
    assert not any(r.built for r in pulled.values())  # every stage came from the remote
    assert store_files(tmp_path / "a" / "tokenize") == store_files(tmp_path / "b" / "tokenize")
    assert store_files(tmp_path / "a" / "pack") == store_files(tmp_path / "b" / "pack")

    # builds are deterministic: a third machine without the remote builds the same files, stage by stage
    c = parse_config(machine(tmp_path, "c", corpus, tokenizer_dir, None, bucket))
    assert all(r.built for r in pipeline.walk(c).values())
    for stage in sorted({Path(r.path).parent.name for r in built.values()}):
        assert store_files(tmp_path / "c" / stage) == store_files(tmp_path / "a" / stage), stage
        for key_dir in (tmp_path / "c" / stage).iterdir():
            if not key_dir.name.startswith("."):
                local = json.loads((key_dir / "_manifest.json").read_text())
                assert local["files"] == remote.manifest(stage, key_dir.name)["files"], stage


def test_a_server_killed_mid_upload_leaves_nothing_visible_and_a_rerun_uploads(
    tmp_path, corpus, tokenizer_dir, s3_server, s3_bucket, monkeypatch
):
    url = f"s3://{s3_bucket}/cache"
    local = parse_config(machine(tmp_path, "a", corpus, tokenizer_dir, None, s3_server))
    pipeline.walk(local, until="convert")
    (entry,) = [p for p in (tmp_path / "a" / "convert").iterdir() if not p.name.startswith(".")]
    remote = RemoteCache(url, {"endpoint_url": s3_server.endpoint})
    # a client of its own to inject the fault into (moai keeps one client per endpoint for the process)
    remote.fs = _new_filesystem(url, "s3", {"endpoint_url": s3_server.endpoint})
    put_file = remote.fs.put_file
    calls = []

    def dies_after_the_first_file(lpath, rpath, **kw):
        if calls:
            s3_server.kill()  # the server dies between a data file and the manifest
        calls.append(rpath)
        return put_file(lpath, rpath, **kw)

    monkeypatch.setattr(remote.fs, "put_file", dies_after_the_first_file)
    started = time.monotonic()
    try:
        with pytest.raises(MoaiError) as info:
            remote.push(entry, "convert", entry.name)
        assert time.monotonic() - started < 30
        line = str(info.value)
        assert "\n" not in line and f"{url}/convert/{entry.name}/" in line
        assert "nothing of convert" in line and "local store is intact" in line
    finally:
        s3_server.start()
    assert store_files(tmp_path / "a" / "convert")  # the local entry is intact
    again = RemoteCache(url, {"endpoint_url": s3_server.endpoint})
    assert not again.has("convert", entry.name)  # data files without a manifest: absent
    assert again.push(entry, "convert", entry.name) and again.has("convert", entry.name)


def test_a_corrupted_remote_object_is_refused_on_pull(tmp_path, corpus, tokenizer_dir, s3_server, s3_bucket):
    url = f"s3://{s3_bucket}/cache"
    a = parse_config(machine(tmp_path, "a", corpus, tokenizer_dir, url, s3_server))
    pipeline.walk(a, until="convert")
    remote = remote_of(a)
    (entry,) = [e for e in remote.entries() if e.stage == "convert"]
    victim = sorted(rel for rel in remote.manifest("convert", entry.key)["files"] if rel.endswith(".arrow"))[0]
    fs = s3_server.fs()
    data = bytearray(fs.cat_file(f"{url}/convert/{entry.key}/{victim}"))
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    fs.pipe_file(f"{url}/convert/{entry.key}/{victim}", bytes(data))
    b = parse_config(machine(tmp_path, "b", corpus, tokenizer_dir, url, s3_server))
    with pytest.raises(CacheError, match=rf"remote cache entry .*{entry.key} is damaged: {victim} .*remove it"):
        pipeline.walk(b, until="convert")
    convert_dir = tmp_path / "b" / "convert"
    assert not [p for p in convert_dir.iterdir() if p.name == entry.key or p.name.startswith(".tmp")]


def test_remote_faults_are_one_line_in_seconds(tmp_path, corpus, tokenizer_dir, s3_server, s3_bucket, gcs_server):
    from s3_server import _free_ports

    (closed,) = _free_ports(1)
    s3 = s3_server.options
    cases = {
        "wrong-key": (f"s3://{s3_bucket}/c", s3, {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "no"}),
        "no-bucket": (f"s3://nothing-{s3_bucket}/c", s3, s3_server.env()),
        "no-server": (f"s3://{s3_bucket}/c", {"endpoint_url": f"http://127.0.0.1:{closed}"}, s3_server.env()),
        "gs-no-bucket": (f"gs://nothing-{s3_bucket}/c", gcs_server.options, {}),
    }
    expected = {
        "wrong-key": "access denied",
        "no-bucket": f"the bucket nothing-{s3_bucket} does not exist: create it",
        "no-server": "cannot reach the endpoint",  # and the setting to check:
        "no-server-fix": "check remote_cache_options.endpoint_url",
        "gs-no-bucket": f"does not exist: create it (gcloud storage buckets create gs://nothing-{s3_bucket})",
    }
    for name, (url, options, env) in cases.items():
        cfg = machine(tmp_path, name, corpus, tokenizer_dir, url, s3_server)
        cfg["remote_cache_options"] = options
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        started = time.monotonic()
        run = moai_cli("cache", "list", f"{name}.yaml", "--remote", cwd=tmp_path, env=env)
        seconds = time.monotonic() - started
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1, (name, run.stderr[-2000:])
        line = lines[0]
        assert run.returncode == 2 and line.startswith("moai: error: ") and expected[name] in line, (name, line)
        assert expected.get(f"{name}-fix", "") in line
        assert url.split("/c")[0] in line and seconds < 20, (name, seconds)


def test_cache_push_pull_and_list_on_the_remote(tmp_path, corpus, tokenizer_dir, s3_server, s3_bucket):
    url = f"s3://{s3_bucket}/cli"
    local = machine(tmp_path, "a", corpus, tokenizer_dir, None, s3_server)
    pipeline.walk(parse_config(local), until="tokenize")  # built with no remote: nothing uploaded yet
    shared = {**local, "remote_cache": url, "remote_cache_options": {"endpoint_url": s3_server.endpoint}}
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(shared))
    env = s3_server.env()
    push = moai_cli("cache", "push", "a.yaml", cwd=tmp_path, env=env)
    assert push.returncode == 0, push.stderr
    uploaded = int(push.stdout.split()[0])
    assert uploaded >= 4 and f"entries uploaded to {url}" in push.stdout
    listed = moai_cli("cache", "list", "a.yaml", "--remote", cwd=tmp_path, env=env)
    assert "convert" in listed.stdout and "tokenize" in listed.stdout, listed.stderr
    b = {**shared, "cache_dir": str(tmp_path / "b")}
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(b))
    pull = moai_cli("cache", "pull", "b.yaml", cwd=tmp_path, env=env)  # the entries b.yaml needs
    assert pull.returncode == 0 and pull.stdout.startswith(f"{uploaded} entries pulled from {url}"), pull.stderr
    assert store_files(tmp_path / "a" / "tokenize") == store_files(tmp_path / "b" / "tokenize")
    again = moai_cli("cache", "pull", "b.yaml", "--all", cwd=tmp_path, env=env)
    assert again.stdout.startswith(f"0 entries pulled from {url}") and f"{uploaded} already here" in again.stdout
    assert s3_server.secret not in push.stdout + push.stderr + listed.stdout + pull.stdout + pull.stderr


def test_credentials_in_remote_cache_options_are_refused(tmp_path):
    cfg = {"source": {"path": "x.jsonl"}, "tokenizer": {"path": "t"}, "remote_cache": "s3://b/p"}
    with pytest.raises(ValueError, match=r"remote_cache_options\.key: credentials do not go in a config"):
        parse_config({**cfg, "remote_cache_options": {"key": "AKIA"}})
    with pytest.raises(ValueError, match=r"remote_cache 'b/p' is not a URL"):
        parse_config({**cfg, "remote_cache": "b/p"})


def test_doctor_checks_the_remote_cache(tmp_path, corpus, tokenizer_dir, s3_server, s3_bucket):
    from moai.doctor import evaluate, gather

    good = parse_config(machine(tmp_path, "a", corpus, tokenizer_dir, f"s3://{s3_bucket}/c", s3_server))
    (check,) = [c for c in evaluate(gather(good)) if c.name == "remote cache"]
    assert check.status == "pass" and "writable" in check.detail
    assert s3_server.fs().find(s3_bucket) == []  # the write probe is removed
    missing = parse_config(machine(tmp_path, "a", corpus, tokenizer_dir, f"s3://gone-{s3_bucket}/c", s3_server))
    (check,) = [c for c in evaluate(gather(missing)) if c.name == "remote cache"]
    assert check.status == "fail" and f"the bucket gone-{s3_bucket} does not exist" in check.detail


def test_two_machines_pushing_one_key_at_once_leave_an_entry_that_pulls(
    tmp_path, corpus, tokenizer_dir, s3_server, s3_bucket
):
    import shutil
    import threading

    url = f"s3://{s3_bucket}/race"
    for name in ("a", "b"):  # two machines build the same key, each on its own (deterministic)
        pipeline.walk(parse_config(machine(tmp_path, name, corpus, tokenizer_dir, None, s3_server)), until="convert")
    (key,) = [p.name for p in (tmp_path / "a" / "convert").iterdir() if not p.name.startswith(".")]
    assert store_files(tmp_path / "a" / "convert") == store_files(tmp_path / "b" / "convert")
    errors = []

    def push(name):
        try:
            RemoteCache(url, {"endpoint_url": s3_server.endpoint}).push(
                tmp_path / name / "convert" / key, "convert", key
            )
        except Exception as err:  # collected: the test fails on any
            errors.append(err)

    threads = [threading.Thread(target=push, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    fresh = tmp_path / "fresh" / "convert"
    fresh.mkdir(parents=True)
    assert RemoteCache(url, {"endpoint_url": s3_server.endpoint}).pull(fresh, "convert", key)
    shutil.rmtree(fresh / key / "_manifest.json", ignore_errors=True)
    assert store_files(tmp_path / "fresh" / "convert") == store_files(tmp_path / "a" / "convert")
