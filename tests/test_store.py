import json
import shutil
import threading

import pytest

from moai.errors import CacheError
from moai.store import MANIFEST, Store, fingerprint_files, stage_key, verify_cache


def test_keys_are_stable_and_change_with_each_input():
    base = stage_key("pack", 1, ["up"], {"seq_len": 8, "mode": "concat"})
    assert base == stage_key("pack", 1, ["up"], {"mode": "concat", "seq_len": 8})  # order-free
    others = {
        stage_key("pack", 2, ["up"], {"seq_len": 8, "mode": "concat"}),
        stage_key("pack", 1, ["up2"], {"seq_len": 8, "mode": "concat"}),
        stage_key("pack", 1, ["up"], {"seq_len": 9, "mode": "concat"}),
        stage_key("save", 1, ["up"], {"seq_len": 8, "mode": "concat"}),
    }
    assert base not in others and len(others) == 4


def test_file_fingerprint_follows_content(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("hello")
    f1 = fingerprint_files([a])
    a.write_text("hellp")
    assert fingerprint_files([a]) != f1
    a.write_text("hello")
    assert fingerprint_files([a]) == f1


def test_build_publishes_once_with_manifest(tmp_path):
    store = Store(tmp_path)
    calls = []

    def builder(out):
        calls.append(out)
        (out / "data.txt").write_text("x")
        return {"rows_out": 1}

    first = store.build("stage", "k1", builder, manifest={"settings": {"a": 1}})
    second = store.build("stage", "k1", builder)
    assert first.built and not second.built and len(calls) == 1
    assert first.path == second.path == tmp_path / "stage" / "k1"
    manifest = json.loads((first.path / MANIFEST).read_text())
    assert manifest["key"] == "k1" and manifest["report"] == {"rows_out": 1} and manifest["settings"] == {"a": 1}
    assert [p.name for p in (tmp_path / "stage").iterdir() if not p.name.startswith(".")] == ["k1"]


def test_failing_builder_leaves_nothing(tmp_path):
    store = Store(tmp_path)

    def boom(out):
        (out / "half.bin").write_bytes(b"\0" * 10)
        raise ValueError("bad row")

    with pytest.raises(ValueError, match="bad row"):
        store.build("stage", "k", boom)
    assert not store.exists("stage", "k")
    assert [p.name for p in (tmp_path / "stage").iterdir() if not p.name.endswith(".lock")] == []


def test_leftover_of_a_dead_builder_is_removed(tmp_path):
    store = Store(tmp_path)
    stale = tmp_path / "stage" / ".tmp-k-12345-deadbeef"
    stale.mkdir(parents=True)
    (stale / "half.bin").write_bytes(b"\0")
    pub = store.build("stage", "k", lambda out: {"ok": True})
    assert pub.built and not stale.exists()


def test_racing_threads_build_once(tmp_path):
    store = Store(tmp_path)
    builds = []
    gate = threading.Barrier(8)
    results = []

    def builder(out):
        builds.append(1)
        (out / "f").write_text("x")
        return {}

    def worker():
        gate.wait()
        results.append(store.build("stage", "k", builder))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(results) == 8
    assert sum(r.built for r in results) == 1 and len({r.path for r in results}) == 1


def _publish(store, key="k"):
    def builder(out):
        (out / "sub").mkdir()
        (out / "sub" / "part.bin").write_bytes(bytes(range(256)) * 16)
        (out / "meta.json").write_text("{}")
        return {}

    return store.build("stage", key, builder)


def test_manifest_lists_every_file_with_size_and_digest(tmp_path):
    import xxhash

    pub = _publish(Store(tmp_path))
    files = json.loads((pub.path / MANIFEST).read_text())["files"]
    assert files == {
        "meta.json": {"bytes": 2, "xxh3_128": xxhash.xxh3_128(b"{}").hexdigest()},
        "sub/part.bin": {"bytes": 4096, "xxh3_128": xxhash.xxh3_128(bytes(range(256)) * 16).hexdigest()},
    }


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.write_bytes(p.read_bytes()[:1200]), "sub/part.bin has 1200 bytes, its manifest says 4096"),
        (lambda p: p.unlink(), "sub/part.bin is missing"),
    ],
)
def test_reuse_of_a_damaged_entry_names_the_folder_and_the_fix(tmp_path, damage, message):
    store = Store(tmp_path)
    pub = _publish(store)
    damage(pub.path / "sub" / "part.bin")
    for reuse in (lambda: store.build("stage", "k", lambda out: {}), lambda: store.read("stage", "k")):
        with pytest.raises(CacheError) as err:
            reuse()
        assert str(err.value) == (
            f"cache entry {pub.path} is damaged: {message}; remove the folder "
            f"(rm -rf {pub.path}) and rerun: it will be rebuilt"
        )
    shutil.rmtree(pub.path)  # the fix works: the next build builds
    assert _publish(store).built


def test_reuse_checks_sizes_only(tmp_path):
    """Reuse stays O(files): same-size damage is for `verify_cache`, which reads every byte."""
    store = Store(tmp_path)
    pub = _publish(store)
    part = pub.path / "sub" / "part.bin"
    part.write_bytes(b"\xff" + part.read_bytes()[1:])
    assert not store.read("stage", "k").built
    assert [c.status for c in verify_cache(tmp_path)] == ["damaged"]


def test_an_older_manifest_without_file_list_is_reused(tmp_path):
    store = Store(tmp_path)
    pub = _publish(store)
    manifest = json.loads((pub.path / MANIFEST).read_text())
    del manifest["files"]
    (pub.path / MANIFEST).write_text(json.dumps(manifest))
    assert store.read("stage", "k").manifest["key"] == "k"
    assert [c.status for c in verify_cache(tmp_path)] == ["unverifiable"]


def test_an_unreadable_manifest_is_a_cache_error(tmp_path):
    store = Store(tmp_path)
    pub = _publish(store)
    (pub.path / MANIFEST).write_text("")
    with pytest.raises(CacheError, match=f"cache entry {pub.path} is damaged: its _manifest.json is empty; remove"):
        store.build("stage", "k", lambda out: {})


def test_a_folder_without_manifest_is_a_cache_error(tmp_path):
    (tmp_path / "stage" / "k").mkdir(parents=True)
    with pytest.raises(CacheError, match=r"stage/k is damaged: it has no _manifest.json; remove the folder \(rm -rf"):
        Store(tmp_path).build("stage", "k", lambda out: {})


def test_verify_cache_checks_digests_and_extra_files_and_skips_unpublished(tmp_path):
    store = Store(tmp_path)
    _publish(store, "a")
    b = _publish(store, "b")
    c = _publish(store, "c")
    (b.path / "meta.json").write_text("[]")  # same size, other bytes
    (c.path / "sub" / "cache-1234.arrow").write_bytes(b"x")  # written into a published folder
    (tmp_path / "stage" / ".tmp-d-1-deadbeef").mkdir()  # a build in progress or left by a dead builder
    (tmp_path / "runs" / "tiny").mkdir(parents=True)  # not a store entry: no manifest
    checks = list(verify_cache(tmp_path))
    assert [(c.key, c.status) for c in checks] == [("a", "ok"), ("b", "damaged"), ("c", "damaged")]
    assert checks[1].problems == ("meta.json has other content than its manifest records (xxh3-128 differs)",)
    assert checks[2].problems == ("sub/cache-1234.arrow is not in its manifest",)
    assert checks[1].message.startswith(f"cache entry {b.path} is damaged: meta.json has other content")
    with pytest.raises(CacheError, match="no cache to verify"):
        list(verify_cache(tmp_path / "nowhere"))
