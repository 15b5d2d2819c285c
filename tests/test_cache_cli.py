"""`moai cache list` and `moai cache prune` on real caches: what is there, and removing it safely
(never a build another process is running; never a half-deleted folder that looks published)."""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import PYTHON, config_dict, make_texts, subprocess_env, write_jsonl
from moai.cli import main
from moai.pipeline import prepare
from moai.presets import resolve_config
from moai.store import Store, stage_key

STAGES = ["convert", "filter", "pack", "save", "tokenize", "tokenizer"]


def moai_main(*args: str) -> int:
    """The CLI in this process (it sets SIGINT and SIGTERM handlers: put the test runner's back)."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return main(list(args))
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tokenizer_dir):
    """A cache built by one config file (as `moai prepare a.yaml` does) and that config's file."""
    root = tmp_path_factory.mktemp("cache-cli")
    corpus = write_jsonl(root / "corpus.jsonl", [{"text": t} for t in make_texts(600, seed=5)])
    data = config_dict(root, corpus, {"path": str(tokenizer_dir)})
    cfg = root / "a.yaml"
    cfg.write_text(yaml.safe_dump(data))
    result = prepare(resolve_config(str(cfg)), progress=False)
    return cfg, data, {stage: s["key"] for stage, s in result["stages"].items()}


@pytest.fixture
def cache(prepared, tmp_path):
    """(config file, config dict, stage keys, cache dir): a copy of the prepared cache under tmp_path."""
    cfg, data, keys = prepared
    shutil.copytree(data["cache_dir"], tmp_path / "cache")
    return cfg, data, keys, tmp_path / "cache"


BUILDER = """
import sys, time
from pathlib import Path
from moai.store import Store
root, key, go = sys.argv[1:4]
def build(out):
    (out / "half.bin").write_bytes(b"x" * 1000)
    print("building", flush=True)
    while not Path(go).exists():
        time.sleep(0.05)
    return {}
print(Store(root).build("pack", key, build).built, flush=True)
"""


@pytest.fixture
def running_build(cache, tmp_path):
    """A second process in the middle of building pack/<key> (it holds the key's lock); `finish()`
    lets it publish and returns what it printed last."""
    root = cache[3]
    key, go = stage_key("pack", 99, [], {}), tmp_path / "go"
    proc = subprocess.Popen(
        [PYTHON, "-c", BUILDER, str(root), key, str(go)], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "building"

    def finish() -> str:
        go.touch()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        return out.strip()

    yield key, finish
    if proc.poll() is None:
        go.touch()
        proc.wait(timeout=60)


def leftovers(root: Path, keys: dict) -> dict[str, Path]:
    """What dead builders and a dead prune leave, and a lock nobody uses."""
    dead = root / "tokenize" / f".tmp-{keys['tokenize']}-4242-deadbeef"
    dead.mkdir()
    (dead / "part-00000.bin").write_bytes(b"\0" * 5000)
    trash = root / "save" / f".trash-{keys['save']}-4243-cafebabe"
    trash.mkdir()
    (trash / "data.arrow").write_bytes(b"\0" * 3000)
    stray = root / "filter" / f".{stage_key('filter', 99, [], {})}.lock"
    stray.touch()
    return {"dead": dead, "trash": trash, "stray": stray}


def test_list_names_every_entry_leftover_and_lock_with_its_config_and_use(cache, running_build, capsys):
    cfg, _, keys, root = cache
    building, _ = running_build
    made = leftovers(root, keys)
    (root / "runs" / "tiny").mkdir(parents=True)  # a training run's output: not the store's, not listed
    assert moai_main("cache", "list", str(root)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["STAGE", "NAME", "KIND", "SIZE", "AGE", "IN", "USE", "CONFIG"]
    rows = [line.split() for line in lines[1:-1]]
    entries = [r for r in rows if r[2] == "entry"]
    assert [(r[0], r[1], r[-1]) for r in entries] == [(s, keys[s], str(cfg.resolve())) for s in STAGES]
    assert all(r[4] in ("B", "kB", "MB") and re.fullmatch(r"\d+[smh]", r[5]) and r[6] == "-" for r in entries)
    others = {(r[0], r[1]): (r[2] + (" " + r[3] if r[3] == "lock" else ""), r[-2]) for r in rows if r[2] != "entry"}
    assert others == {
        ("tokenize", made["dead"].name): ("leftover", "-"),
        ("save", made["trash"].name): ("leftover", "-"),
        ("pack", next((root / "pack").glob(f".tmp-{building}-*")).name): ("leftover", "yes"),  # being built now
        ("filter", made["stray"].name): ("stray lock", "-"),
    }
    assert lines[-1].startswith("6 entries (") and ", 3 leftovers (" in lines[-1]
    assert lines[-1].endswith(", 1 stray locks; 1 in use by a running build")


def test_prune_by_default_removes_only_leftovers_and_never_a_running_build(cache, running_build, capsys):
    _, data, keys, root = cache
    building, finish = running_build
    made = leftovers(root, keys)
    tmp = next((root / "pack").glob(f".tmp-{building}-*"))
    assert moai_main("cache", "prune", "--cache-dir", str(root)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines[:-2]) == sorted(
        [
            f"removed tokenize/{made['dead'].name} (leftover, 5.0 kB)",
            f"removed save/{made['trash'].name} (leftover, 3.0 kB)",
            f"removed filter/{made['stray'].name} (stray lock, 0 B)",
        ]
    )
    assert lines[-2:] == [
        f"kept pack/{tmp.name} (leftover): in use by a running build",
        "3 entries removed, 0.00 GB freed; 1 kept",
    ]
    assert not any(p.exists() for p in made.values()) and tmp.is_dir()
    assert finish() == "True"  # the other build was not disturbed: it published
    again = prepare(resolve_config(_write(root.parent / "b.yaml", data | {"cache_dir": str(root)})), progress=False)
    assert not any(s["built"] for s in again["stages"].values())  # every entry is still there


def _write(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_prune_keep_removes_what_the_configs_do_not_need_and_dry_run_removes_nothing(cache, tmp_path, capsys):
    cfg, data, keys, root = cache
    other = _write(tmp_path / "b.yaml", data | {"cache_dir": str(root), "pack": {"enabled": True, "seq_len": 32}})
    other_pack = prepare(resolve_config(other), progress=False)["stages"]["pack"]["key"]
    assert other_pack != keys["pack"]
    folder = root / "pack" / other_pack
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())

    assert moai_main("cache", "prune", str(root), "--keep", str(cfg), "--dry-run") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"would remove pack/{other_pack} (entry, ")
    assert lines[1:] == ["1 entries would be removed, 0.00 GB would be freed (dry run)"]
    assert folder.is_dir()

    assert moai_main("cache", "prune", str(root), "--keep", str(cfg), "--keep", other) == 0
    assert capsys.readouterr().out.splitlines() == ["0 entries removed, 0.00 GB freed"]

    assert moai_main("cache", "prune", str(root), "--keep", str(cfg)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"1 entries removed, {size / 1e9:.2f} GB freed"
    assert not folder.exists() and not (root / "pack" / f".{other_pack}.lock").exists()
    assert [p.name for p in (root / "pack").iterdir() if p.name.startswith(".trash-")] == []
    kept = prepare(resolve_config(_write(tmp_path / "a.yaml", data | {"cache_dir": str(root)})), progress=False)
    assert not any(s["built"] for s in kept["stages"].values())


def test_prune_older_than_goes_by_the_last_use(cache, capsys):
    _, _, keys, root = cache
    log = root / "tokenize" / ".uses.jsonl"
    month_ago = time.time() - 40 * 86400
    log.write_text(json.dumps({"key": keys["tokenize"], "config": None, "at": month_ago, "built": True}) + "\n")
    assert moai_main("cache", "prune", str(root), "--older-than", "30d") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"removed tokenize/{keys['tokenize']} (entry, ") and lines[-1].startswith("1 entries")
    assert sorted(p.name for p in (root / "tokenize").iterdir()) == [".uses.jsonl"]
    assert moai_main("cache", "prune", str(root), "--older-than", "30x") == 2
    assert capsys.readouterr().err.strip() == (
        "moai: error: --older-than '30x': give a number and a unit (s, m, h, d, w), e.g. 30d or 12h"
    )


def test_a_prune_that_fails_half_way_leaves_a_leftover_never_a_half_deleted_entry(tmp_path, capsys):
    from conftest import lock_down

    store, key = Store(tmp_path), stage_key("pack", 1, [], {})

    def builder(out):
        (out / "sub").mkdir()
        for name in ("a.bin", "b.bin"):
            (out / "sub" / name).write_bytes(b"\0" * 100)
        return {}

    pub = store.build("pack", key, builder)
    # rmtree stops half-way: at the immutable file (root), or in the folder it cannot write (a user)
    locked = Path("sub") / "b.bin" if os.geteuid() == 0 else Path("sub")
    undo = lock_down(pub.path / locked)
    try:
        assert moai_main("cache", "prune", str(tmp_path), "--older-than", "0s") == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith(f"kept pack/{key} (entry): cannot remove it (")
        assert not pub.path.exists() and not store.exists("pack", key)  # unpublished at once, by one rename
        (trash,) = (tmp_path / "pack").glob(f".trash-{key}-*")
        assert (trash / locked).exists()
    finally:
        undo(next((tmp_path / "pack").glob(f".trash-{key}-*"), pub.path) / locked)
    assert moai_main("cache", "list", str(tmp_path)) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == ["pack", trash.name, "leftover"]
    assert moai_main("cache", "prune", str(tmp_path)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"removed pack/{trash.name} (leftover, ") and out[1:] == [
        "1 entries removed, 0.00 GB freed"
    ]
    assert sorted(p.name for p in (tmp_path / "pack").iterdir()) == [".uses.jsonl"]
    assert store.build("pack", key, builder).built
