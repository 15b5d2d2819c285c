"""The sample index reader: format 1 (one source, shuffled by the trainer) as it always was, and
format 2 (several sources, stored order) read from each source's own token store; damaged indexes
are refused with one line."""

import json
import shutil

import numpy as np
import pytest

from mixed_sources import make_sources, windows, write_mixed_index
from moai.errors import CacheError
from moai.formats.tokens import PackedSamples, TokenStore

SEQ = 16


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("sources")
    return root / "cache", make_sources(root, tokenizer_dir, {"ko": 60, "code": 60, "en": 30})


@pytest.fixture
def mixed(stores, tmp_path):
    """A fresh copy of the cache with a hand-written format-2 index in it (tests may damage it)."""
    cache, found = stores
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    moved = {name: copy / path.relative_to(cache) for name, path in found.items()}
    return write_mixed_index(copy, moved, SEQ), moved


def test_format_1_reads_as_before_with_one_default_source(stores):
    from moai.stages.pack import concat_chunk

    cache, found = stores
    store = found["ko"]
    folder = cache / "pack" / "by-hand-1"
    folder.mkdir(parents=True, exist_ok=True)
    split = TokenStore(store).split("train")
    np.save(folder / "train.npy", concat_chunk(split.num_tokens, SEQ, True))
    meta = {
        "format": "moai-sample-index/1",
        "seq_len": SEQ,
        "mode": "concat",
        "token_store": str(store.relative_to(cache)),
    }
    (folder / "pack.json").write_text(json.dumps({**meta, "splits": {"train": split.num_tokens // SEQ}}))

    samples = PackedSamples(folder, "train")
    assert len(samples) == split.num_tokens // SEQ and samples.samples.shape == (len(samples), 2)
    assert samples.order == "shuffle" and samples.source_names == ["default"] and not samples.mixed
    assert samples.source(3) == "default" and samples.source_ids.shape == (len(samples),)
    assert not samples.source_ids.any() and samples.source_ids.nbytes <= 8 * len(samples)
    for i in (0, 1, len(samples) - 1):
        item = samples[i]
        assert item["input_ids"].tolist() == split.tokens(i * SEQ, (i + 1) * SEQ).tolist()
    assert samples.window(2) == (0, 2 * SEQ, SEQ)

    (folder / "pack.json").write_text(json.dumps({**meta, "source": "ko", "splits": {"train": len(samples)}}))
    assert PackedSamples(folder, "train").source_names == ["ko"]


def test_format_2_reads_each_window_from_its_sources_store(mixed):
    folder, found = mixed
    samples = PackedSamples(folder, "train")
    names = list(found)
    assert samples.mixed and samples.order == "as-stored" and samples.source_names == names
    index = np.load(folder / "train.npy")
    assert len(samples) == len(index) == sum(len(windows(found[n], "train", SEQ)) for n in names)
    assert isinstance(samples.source_ids, np.memmap) or isinstance(samples.source_ids.base, np.memmap)
    assert samples.source_ids.tolist() == index[:, 0].tolist()
    assert len(set(samples.source_ids[:30].tolist())) == 3  # interleaved, not grouped
    splits = {n: TokenStore(found[n]).split("train") for n in names}
    for i in range(len(samples)):
        k, start, length = (int(v) for v in index[i])
        item = samples[i]
        assert samples.source(i) == names[k] and samples.window(i) == (k, start, length)
        assert item["input_ids"].tolist() == splits[names[k]].tokens(start, start + length).tolist()
        offs = splits[names[k]].doc_offsets
        inside = offs[(offs > start) & (offs < start + length)] - start
        assert item["position_ids"][0] == 0
        assert all(item["position_ids"][j] == 0 for j in inside)

    val = PackedSamples(folder, "validation")
    assert len(val) == sum(len(windows(found[n], "validation", SEQ)) for n in names) > 0
    assert {val.source(i) for i in range(len(val))} == set(names)


def _rewrite(folder, split, array, **meta):
    np.save(folder / f"{split}.npy", array)
    if meta:
        pack = json.loads((folder / "pack.json").read_text())
        (folder / "pack.json").write_text(json.dumps({**pack, **meta}))


def test_a_damaged_mixed_index_is_refused_with_one_line(mixed):
    folder, found = mixed
    index = np.load(folder / "train.npy")
    n = len(index)

    _rewrite(folder, "train", index[:, 1:])
    with pytest.raises(CacheError, match=rf"train.npy holds int64 \({n}, 2\), pack.json says int64 \({n}, 3\)"):
        PackedSamples(folder, "train")

    bad = index.copy()
    bad[5, 0] = 3
    _rewrite(folder, "train", bad)
    with pytest.raises(CacheError, match=r"source indices outside \[0, 3\) \(pack.json lists 3 sources\)"):
        PackedSamples(folder, "train")

    # a window that fits the largest source, filed under the smallest one
    sizes = {n: TokenStore(p).split("train").num_tokens for n, p in found.items()}
    small, big = min(sizes, key=sizes.get), max(sizes, key=sizes.get)
    bad = index.copy()
    row = int(np.flatnonzero(index[:, 0] == list(found).index(small))[0])
    bad[row, 0], bad[row, 1] = list(found).index(small), sizes[big] - SEQ
    _rewrite(folder, "train", bad)
    with pytest.raises(CacheError) as err:
        PackedSamples(folder, "train")
    assert f"outside the {sizes[small]} tokens of split 'train'" in str(err.value)
    assert f"(source {small!r})" in str(err.value) and "\n" not in str(err.value)

    _rewrite(folder, "train", index[:-1])
    with pytest.raises(CacheError, match=rf"holds int64 \({n - 1}, 3\), pack.json says int64 \({n}, 3\)"):
        PackedSamples(folder, "train")

    _rewrite(folder, "train", index)
    with open(folder / "train.npy", "r+b") as f:
        f.truncate((folder / "train.npy").stat().st_size - 8)
    with pytest.raises(CacheError, match=r"train.npy cannot be opened"):
        PackedSamples(folder, "train")

    _rewrite(folder, "train", index, order="sorted")
    with pytest.raises(CacheError, match=r"order 'sorted', expected one of \['shuffle', 'as-stored'\]"):
        PackedSamples(folder, "train")


def test_a_mixed_index_exports_to_webdataset_sample_for_sample(mixed, tmp_path):
    import tarfile

    from moai.formats.webdataset import decode_sample, export_webdataset

    folder, _ = mixed
    samples = PackedSamples(folder, "train")
    manifest = export_webdataset(folder, tmp_path / "wds", shard_size="8KB")
    assert manifest["samples"] == len(samples) and len(manifest["shards"]) > 1
    entries: dict[str, dict] = {}
    for shard in manifest["shards"]:
        with tarfile.open(tmp_path / "wds" / shard["name"]) as tar:
            for member in tar.getmembers():
                key, field = member.name.split(".", 1)
                entries.setdefault(key, {"__key__": key})[field] = tar.extractfile(member).read()
    assert len(entries) == len(samples)
    for i in (0, 1, 2, len(samples) - 1):
        got = decode_sample(entries[f"{i:09d}"], manifest["dtype"])
        want = samples[i]
        assert got["input_ids"].tolist() == want["input_ids"].tolist()
        assert got["position_ids"].tolist() == want["position_ids"].tolist()
