import json
import threading

import pytest

from moai.store import MANIFEST, Store, fingerprint_files, stage_key


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
