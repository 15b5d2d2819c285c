import errno
import json
import re
import shutil
import threading

import pytest

from conftest import read_only
from moai.cache import verify_cache
from moai.errors import CacheError
from moai.store import MANIFEST, MANIFEST_DIGEST, Store, fingerprint_files, stage_key


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
    assert [p.name for p in (tmp_path / "stage").iterdir()] == []  # no lock file either


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


def test_reuse_hashes_small_files_so_same_size_damage_is_refused(tmp_path):
    """Same-size damage to a small file is caught on reuse (tests/test_reuse_checks.py: every kind)."""
    store = Store(tmp_path)
    pub = _publish(store)
    part = pub.path / "sub" / "part.bin"
    part.write_bytes(b"\xff" + part.read_bytes()[1:])
    with pytest.raises(CacheError, match=r"sub/part\.bin has changed since it was built"):
        store.read("stage", "k")
    assert [c.status for c in verify_cache(tmp_path)] == ["damaged"]


def test_an_older_manifest_without_file_list_is_reused(tmp_path):
    store = Store(tmp_path)
    pub = _publish(store)
    manifest = json.loads((pub.path / MANIFEST).read_text())
    del manifest["files"]
    (pub.path / MANIFEST).write_text(json.dumps(manifest))
    (pub.path / MANIFEST_DIGEST).unlink()  # as an older moai wrote it: no digest of the manifest
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


# -- faults of the machine and broken entries: one CacheError line each --------------------------


KEY = stage_key("stage", 1, [], {})


def test_a_manifest_without_report_is_a_cache_error_on_reuse_and_in_verify(tmp_path):
    store = Store(tmp_path)
    pub = _publish(store, KEY)
    manifest = json.loads((pub.path / MANIFEST).read_text())
    del manifest["report"]
    (pub.path / MANIFEST).write_text(json.dumps(manifest))
    (pub.path / MANIFEST_DIGEST).unlink()  # as an older moai wrote it: no digest of the manifest
    expected = (
        f"cache entry {pub.path} is damaged: its _manifest.json has no 'report' (the stage's counts); "
        f"remove the folder (rm -rf {pub.path}) and rerun: it will be rebuilt"
    )
    for reuse in (lambda: store.build("stage", KEY, lambda out: {}), lambda: store.read("stage", KEY)):
        with pytest.raises(CacheError) as err:
            reuse()
        assert str(err.value) == expected
    assert [c.message for c in verify_cache(tmp_path)] == [expected]


def test_a_key_folder_without_manifest_is_named_by_read_and_verify(tmp_path):
    folder = tmp_path / "stage" / KEY
    folder.mkdir(parents=True)
    (folder / "data.bin").write_bytes(b"x")
    expected = (
        f"cache entry {folder} is damaged: it has no _manifest.json; remove the folder (rm -rf {folder}) "
        "and rerun: it will be rebuilt"
    )
    with pytest.raises(CacheError) as err:
        Store(tmp_path).read("stage", KEY)
    assert str(err.value) == expected
    assert [(c.status, c.message) for c in verify_cache(tmp_path)] == [("damaged", expected)]


def test_a_read_only_lock_file_is_one_line_naming_it_and_the_fix(tmp_path):
    (tmp_path / "stage").mkdir()
    lock = tmp_path / "stage" / f".{KEY}.lock"
    lock.touch()
    with read_only(lock):
        with pytest.raises(CacheError) as err:
            Store(tmp_path).build("stage", KEY, lambda out: {})
        assert re.fullmatch(
            rf"cannot open the lock file {re.escape(str(lock))} \((Permission denied|Operation not permitted)\); "
            rf"it holds no data: remove it \(rm -f {re.escape(str(lock))}\) or make it writable, then rerun",
            str(err.value),
        ), err.value
        assert [c.message for c in verify_cache(tmp_path)] == [str(err.value)]
    assert Store(tmp_path).build("stage", KEY, lambda out: {}).built  # writable again: builds


def test_an_unwritable_stage_folder_is_one_line_naming_it(tmp_path):
    stage_dir = tmp_path / "stage"
    stage_dir.mkdir()
    with read_only(stage_dir), pytest.raises(CacheError) as err:
        Store(tmp_path).build("stage", KEY, lambda out: {})
    assert str(err.value).startswith(f"cannot create the lock file {stage_dir}/.{KEY}.lock (")
    assert str(err.value).endswith(
        f": its folder {stage_dir} is not writable; make it writable (or set cache_dir to a folder you can "
        "write), then rerun"
    )


def test_an_unwritable_cache_dir_is_one_line_naming_the_stage_and_folder(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    with read_only(root), pytest.raises(CacheError) as err:
        Store(root).build("convert", KEY, lambda out: {})
    assert re.fullmatch(
        rf"convert: cannot write the cache folder {re.escape(str(root / 'convert'))} \(.+\); make it writable "
        r"\(or set cache_dir to a folder you can write\), then rerun",
        str(err.value),
    ), err.value


def _fill(written: int, raise_as):
    def builder(out):
        (out / "part.bin").write_bytes(b"\0" * written)
        raise_as()

    return builder


def _enospc():
    raise OSError(errno.ENOSPC, "No space left on device")


def _wrapped_enospc():  # as pyarrow/datasets do: their own error, the OSError as its cause
    try:
        _enospc()
    except OSError as err:
        raise RuntimeError("failed to write the Arrow file") from err


@pytest.mark.parametrize("raise_as", [_enospc, _wrapped_enospc])
def test_a_disk_full_during_a_build_is_one_line_and_leaves_nothing(tmp_path, raise_as):
    with pytest.raises(CacheError) as err:
        Store(tmp_path).build("tokenize", KEY, _fill(3000, raise_as))
    assert re.fullmatch(
        rf"tokenize: the disk is full \(No space left on device\) building into "
        rf"{re.escape(str(tmp_path / 'tokenize'))}: 3\.0 kB written so far, [\d.]+ [kMG]?B free; nothing was "
        r"published \(the partial build is removed\): free space or set cache_dir to a larger disk, then rerun",
        str(err.value),
    ), err.value
    assert [p.name for p in (tmp_path / "tokenize").iterdir()] == []  # not even the lock file


def test_a_really_full_disk_is_one_line_and_the_space_comes_back(small_disk):
    def builder(out):
        with open(out / "big.bin", "wb") as f:
            for _ in range(64):
                f.write(b"\0" * 65536)  # 4 MiB into 1 MiB
        return {}

    with pytest.raises(
        CacheError,
        match=r"^pack: the disk is full \(No space left on device\) building into .*"
        r": 1\.0 MB written so far, 0 B free; nothing was published",
    ):
        Store(small_disk / "cache").build("pack", KEY, builder)
    assert [p.name for p in (small_disk / "cache" / "pack").iterdir()] == []
    assert Store(small_disk / "cache").build("pack", KEY, _fill(1000, lambda: None)).built  # room again


def test_each_reuse_and_build_is_recorded_with_its_config(tmp_path):
    _publish(Store(tmp_path, origin="/work/a.yaml"), KEY)
    Store(tmp_path, origin="preset tiny").build("stage", KEY, lambda out: {})
    uses = [json.loads(line) for line in (tmp_path / "stage" / ".uses.jsonl").read_text().splitlines()]
    assert [(u["key"], u["config"], u["built"]) for u in uses] == [
        (KEY, "/work/a.yaml", True),
        (KEY, "preset tiny", False),
    ]
    assert uses[0]["at"] <= uses[1]["at"]
