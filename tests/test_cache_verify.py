"""Published folders are checked before they are trusted: reuse (`prepare`) and the readers catch a
truncated file and name the folder and its fix; `moai cache verify` reads every byte of a cache."""

import json
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from conftest import PYTHON, config_dict, make_texts, subprocess_env, write_jsonl
from moai.config import parse_config
from moai.errors import CacheError
from moai.formats.tokens import PackedSamples, TokenStore
from moai.pipeline import prepare
from moai.store import MANIFEST_DIGEST


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tokenizer_dir):
    """One healthy cache (every stage built once); each test damages its own copy."""
    root = tmp_path_factory.mktemp("prepared")
    corpus = write_jsonl(root / "corpus.jsonl", [{"text": t} for t in make_texts(1500, seed=3)])
    data = config_dict(root, corpus, {"path": str(tokenizer_dir)})
    result = prepare(parse_config(data), progress=False)
    return data, result


@pytest.fixture
def cache(prepared, tmp_path):
    """(config dict, stage keys, cache dir): a copy of the prepared cache under tmp_path."""
    data, result = prepared
    shutil.copytree(data["cache_dir"], tmp_path / "cache")
    keys = {stage: s["key"] for stage, s in result["stages"].items()}
    return {**data, "cache_dir": str(tmp_path / "cache")}, keys, tmp_path / "cache"


def rm_fix(folder: Path) -> str:
    return f"; remove the folder (rm -rf {folder}) and rerun: it will be rebuilt"


def test_prepare_refuses_a_truncated_token_bin_then_rebuilds_it_once_removed(cache):
    data, keys, root = cache
    folder = root / "tokenize" / keys["tokenize"]
    part = folder / "train" / "part-00000.bin"
    size = part.stat().st_size
    with open(part, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(CacheError) as err:
        prepare(parse_config(data), progress=False)
    assert str(err.value) == (
        f"cache entry {folder} is damaged: train/part-00000.bin has {size - 1000} bytes, "
        f"its manifest says {size}" + rm_fix(folder)
    )

    shutil.rmtree(folder)  # what the message says to do
    again = prepare(parse_config(data), progress=False)
    assert {name for name, s in again["stages"].items() if s["built"]} == {"tokenize"}
    assert part.stat().st_size == size


def test_prepare_refuses_a_save_arrow_truncated_at_a_record_batch_boundary(cache):
    """The cut the issue met: the stream still reads, only fewer rows, with no error of its own."""
    data, keys, root = cache
    folder = root / "save" / keys["save"]
    arrow = folder / "train" / "data-00000-of-00001.arrow"
    size = arrow.stat().st_size
    with pa.memory_map(str(arrow)) as source:
        rows = pa.ipc.open_stream(source).read_all().num_rows
    with pa.memory_map(str(arrow)) as source:
        first = pa.ipc.open_stream(source).read_next_batch()
        cut = source.tell()  # the end of the first record batch
    assert first.num_rows < rows
    with open(arrow, "r+b") as f:
        f.truncate(cut)
    with pa.memory_map(str(arrow)) as source:
        assert pa.ipc.open_stream(source).read_all().num_rows == first.num_rows  # silently short
    with pytest.raises(CacheError) as err:
        prepare(parse_config(data), progress=False)
    assert str(err.value) == (
        f"cache entry {folder} is damaged: train/data-00000-of-00001.arrow has {cut} bytes, "
        f"its manifest says {size}" + rm_fix(folder)
    )


def test_token_store_reader_refuses_a_truncated_part(cache):
    _, keys, root = cache
    folder = root / "tokenize" / keys["tokenize"]
    part = folder / "validation" / "part-00000.bin"
    meta = json.loads((folder / "tokens.json").read_text())
    tokens = meta["splits"]["validation"]["parts"][0]["num_tokens"]
    with open(part, "r+b") as f:
        f.truncate(part.stat().st_size - 2)
    store = TokenStore(folder)
    assert store.split("train").num_tokens > 0  # other splits still open
    with pytest.raises(CacheError) as err:
        store.split("validation")
    assert str(err.value) == (
        f"token store {folder} is damaged: validation/part-00000.bin has {2 * tokens - 2} "
        f"bytes, tokens.json says {tokens} tokens of 2 bytes ({2 * tokens})" + rm_fix(folder)
    )

    (folder / "train" / "part-00000.idx").unlink()
    with pytest.raises(CacheError, match=r"train/part-00000\.idx is missing; remove the folder"):
        store.split("train")


def test_sample_index_reader_refuses_a_truncated_npy(cache):
    _, keys, root = cache
    folder = root / "pack" / keys["pack"]
    npy = folder / "train.npy"
    with open(npy, "r+b") as f:
        f.truncate(npy.stat().st_size - 16)
    with pytest.raises(CacheError, match=r"sample index .* is damaged: train.npy cannot be opened \(.*\); remove"):
        PackedSamples(folder, "train")
    assert len(PackedSamples(folder, "validation")) > 0


def test_sample_index_reader_refuses_windows_beyond_the_token_split(cache):
    import numpy as np

    _, keys, root = cache
    folder = root / "pack" / keys["pack"]
    samples = np.load(folder / "train.npy")
    samples[-1, 0] += 10**6  # a window past the end, as if the token store were another one
    np.save(folder / "train.npy", samples)
    with pytest.raises(CacheError, match=r"train.npy has windows outside the \d+ tokens of split 'train'"):
        PackedSamples(folder, "train")


def moai(*args, cwd):
    return subprocess.run(
        [PYTHON, "-m", "moai.cli", *args], capture_output=True, text=True, cwd=cwd, env=subprocess_env(), timeout=300
    )


@pytest.mark.slow
def test_cache_verify_passes_a_healthy_cache_and_names_an_altered_entry(cache, tmp_path):
    data, keys, root = cache
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    (root / "runs" / "tiny").mkdir(parents=True)  # a training output beside the stages: not a store entry
    ok = moai("cache", "verify", str(cfg), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == ["6 entries ok, 0 damaged, 0 unverifiable"]

    folder = root / "tokenize" / keys["tokenize"]
    part = folder / "train" / "part-00000.bin"
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, one byte changed: only a digest sees it
    part.write_bytes(bytes(raw))
    bad = moai("cache", "verify", "--cache-dir", str(root), cwd=tmp_path)
    assert bad.returncode == 1, bad.stderr
    assert bad.stdout.splitlines() == [
        f"cache entry {folder} is damaged: train/part-00000.bin has other content than its manifest records "
        "(xxh3-128 differs)" + rm_fix(folder),
        "5 entries ok, 1 damaged, 0 unverifiable",
    ]


@pytest.mark.slow
def test_cache_verify_reports_unreadable_and_older_manifests(cache, tmp_path):
    _, keys, root = cache
    (root / "filter" / keys["filter"] / "_manifest.json").write_text("")
    older = root / "convert" / keys["convert"] / "_manifest.json"
    manifest = json.loads(older.read_text())
    del manifest["files"]
    older.write_text(json.dumps(manifest))
    (older.parent / MANIFEST_DIGEST).unlink()  # as an older moai wrote it
    out = moai("cache", "verify", str(root), cwd=tmp_path)
    assert out.returncode == 1
    assert out.stdout.splitlines() == [
        f"cache entry {older.parent} is unverifiable: its _manifest.json has no file list (written by an older "
        "moai); if in doubt remove the folder: it will be rebuilt when needed",
        f"cache entry {root / 'filter' / keys['filter']} is damaged: its _manifest.json is empty"
        + rm_fix(root / "filter" / keys["filter"]),
        "4 entries ok, 1 damaged, 1 unverifiable",
    ]


def test_prepare_refuses_a_manifest_without_report(cache):
    data, keys, root = cache
    folder = root / "filter" / keys["filter"]
    manifest = json.loads((folder / "_manifest.json").read_text())
    del manifest["report"]
    (folder / "_manifest.json").write_text(json.dumps(manifest))
    (folder / MANIFEST_DIGEST).unlink()  # as an older moai would have written it
    with pytest.raises(CacheError) as err:
        prepare(parse_config(data), progress=False)
    assert str(err.value) == (
        f"cache entry {folder} is damaged: its _manifest.json has no 'report' (the stage's counts)" + rm_fix(folder)
    )


def test_prepare_into_an_unwritable_cache_dir_is_one_line(cache, tmp_path):
    from conftest import read_only

    data, _, _ = cache
    parent = tmp_path / "locked"
    parent.mkdir()
    data = {**data, "cache_dir": str(parent / "cache")}
    with read_only(parent), pytest.raises(CacheError) as err:
        prepare(parse_config(data), progress=False)
    assert str(err.value).startswith(f"convert: cannot write the cache folder {parent / 'cache' / 'convert'} (")
    assert str(err.value).endswith("make it writable (or set cache_dir to a folder you can write), then rerun")


def test_cache_verify_names_a_key_folder_without_manifest_and_an_unusable_lock(cache, capsys):
    from conftest import read_only
    from test_cache_cli import moai_main

    _, keys, root = cache
    folder = root / "save" / keys["save"]
    (folder / "_manifest.json").unlink()
    lock = root / "pack" / f".{keys['pack']}.lock"
    lock.touch()  # left by a builder killed with SIGKILL (a finished build removes its lock file)
    with read_only(lock):
        assert moai_main("cache", "verify", str(root)) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"cannot open the lock file {lock} (")
    assert out[1:] == [
        f"cache entry {folder} is damaged: it has no _manifest.json" + rm_fix(folder),
        "5 entries ok, 2 damaged, 0 unverifiable",
    ]
