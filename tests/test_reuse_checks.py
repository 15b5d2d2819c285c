"""Reuse checks what it can afford: same-size damage to any file of a published folder is refused
with the fix on reuse, never reused silently (moai.store.content_problems)."""

from pathlib import Path

import pytest

from conftest import config_dict
from moai import store as store_mod
from moai.config import parse_config
from moai.errors import CacheError
from moai.pipeline import prepare
from moai.store import MANIFEST, MANIFEST_DIGEST, Store, read_manifest, relative_files


def _flip(path, at: int) -> bytes:
    """Change one byte of `path` at `at` (same size); return the original bytes."""
    data = path.read_bytes()
    damaged = bytearray(data)
    damaged[at] ^= 0x01
    path.write_bytes(bytes(damaged))
    return data


def test_same_size_damage_to_every_file_of_every_published_folder_is_refused_on_reuse(tmp_path, corpus, tokenizer_dir):
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    prepare(cfg, progress=False)
    store = Store(cfg.cache_dir)
    checked = []
    for manifest in sorted(store.root.glob(f"*/*/{MANIFEST}")):
        folder = manifest.parent
        stage, key = folder.parent.name, folder.name
        for rel in [MANIFEST, MANIFEST_DIGEST, *relative_files(folder)]:
            path = folder / rel
            if path.stat().st_size == 0:
                continue
            original = _flip(path, path.stat().st_size // 2)
            try:
                with pytest.raises(CacheError) as err:
                    store.read(stage, key)
                assert f"cache entry {folder} is damaged" in str(err.value) and "rm -rf" in str(err.value)
            finally:
                path.write_bytes(original)
            store.read(stage, key)  # restored: reused again
            checked.append(f"{stage}/{rel.split('/')[-1].split('.')[-1]}")
    kinds = {c.split("/")[0] for c in checked}
    assert {"convert", "filter", "save", "tokenizer", "tokenize", "pack"} <= kinds, checked
    assert any(c.endswith("bin") for c in checked) and "pack/json" in checked and "pack/npy" in checked


def test_any_one_byte_of_a_manifest_changed_is_refused(tmp_path, corpus, tokenizer_dir):
    """Every position, a renamed key included: none makes the entry pass as an older moai's."""
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    pack_dir = Path(prepare(cfg, progress=False)["tokenizer"])  # a short manifest: ~700 bytes
    manifest = pack_dir / MANIFEST
    data = manifest.read_bytes()
    passed = []
    for at in range(len(data)):
        _flip(manifest, at)
        if not isinstance(read_manifest(pack_dir), str):  # what Store.read checks first: a str is the problem
            passed.append(at)
        manifest.write_bytes(data)
    assert passed == []
    with pytest.raises(CacheError):  # and through the store
        _flip(manifest, len(data) // 2)
        Store(cfg.cache_dir).read("tokenizer", pack_dir.name)


def test_a_same_size_edit_of_pack_json_stops_prepare_naming_the_folder(tmp_path, corpus, tokenizer_dir):
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    pack_dir = Path(prepare(cfg, progress=False)["sample_index"])
    text = (pack_dir / "pack.json").read_text()
    edited = text.replace('"seq_len": 64', '"seq_len": 46', 1)  # same size, other windows
    assert len(edited) == len(text) and edited != text
    (pack_dir / "pack.json").write_text(edited)
    with pytest.raises(
        CacheError, match=rf"cache entry {pack_dir} is damaged: pack.json has changed since it was built"
    ):
        prepare(cfg, progress=False)


def test_a_large_file_is_checked_by_sampled_blocks_and_fully_by_verify(tmp_path):
    from moai.cache import verify_cache

    size = store_mod.SMALL_FILE_BYTES * 3

    def builder(out):
        (out / "big.bin").write_bytes(bytes(range(256)) * (size // 256))
        return {}

    pub = Store(tmp_path).build("stage", "k" * 20, builder)
    rec = pub.manifest["files"]["big.bin"]
    assert store_mod.SAMPLED in rec
    big = pub.path / "big.bin"
    original = _flip(big, size - 1)  # inside the last block
    with pytest.raises(CacheError, match=r"big\.bin has changed since it was built"):
        Store(tmp_path).read("stage", "k" * 20)
    big.write_bytes(original)
    # between two sampled blocks: too costly to find on every reuse; `moai cache verify` finds it
    gap = size // (store_mod.SAMPLE_BLOCKS - 1) // 2
    _flip(big, gap)
    Store(tmp_path).read("stage", "k" * 20)
    assert [c.status for c in verify_cache(tmp_path)] == ["damaged"]


@pytest.mark.parametrize(
    "reason, hinted",
    [
        ("training failed: rank 0: IndexError: index out of range in self; full log: x.log", True),
        ("training failed: rank 1: RuntimeError: shape mismatch: value tensor of shape [8] cannot be broadcast", True),
        ("training failed: rank 0: torch.OutOfMemoryError: CUDA out of memory", False),
        # a model config with other head counts: not the data
        ("training failed: rank 0: RuntimeError: The size of tensor a (4) must match the size of tensor b (3)", False),
    ],
)
def test_a_training_failure_a_damaged_store_can_cause_names_the_folders_and_cache_verify(reason, hinted):
    from moai.pipeline import with_damaged_data_hint

    line = with_damaged_data_hint(reason, "/c", ["/c/pack/k1", "/c/tokenize/k2"])
    if hinted:
        assert "(/c/pack/k1, /c/tokenize/k2)" in line and "`moai cache verify /c`" in line
        assert line.startswith(reason.split("; full log: ")[0])
        assert line.endswith("; full log: x.log") == reason.endswith("; full log: x.log")  # the log stays last
    else:
        assert line == reason
