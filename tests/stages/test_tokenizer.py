import json
import logging

import pytest

from conftest import make_texts, train_bpe
from moai.errors import TokenizerError
from moai.stages.tokenizer import describe, load_tokenizer


def test_folder_without_tokenizer_json(tmp_path):
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(TokenizerError, match=r"has no tokenizer\.json \(files: \['vocab\.json'\]\)"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(TokenizerError, match="is a file"):
        load_tokenizer(str(tmp_path / "vocab.json"))


def test_missing_eos_is_refused(tmp_path):
    folder = train_bpe(tmp_path / "t", make_texts(200), vocab_size=300)
    cfg_file = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["eos_token"] = None
    cfg_file.write_text(json.dumps(cfg))
    tok = load_tokenizer(str(folder))
    with pytest.raises(TokenizerError, match="has no EOS token"):
        describe(tok, str(folder), "fp")


def test_pad_missing_or_equal_to_eos_warns(tmp_path, caplog):
    folder = train_bpe(tmp_path / "t", make_texts(200), vocab_size=300)
    tok = load_tokenizer(str(folder))
    tok.pad_token = None
    with caplog.at_level(logging.WARNING):
        info = describe(tok, "x", "fp")
    assert info.pad_id is None and any("no PAD" in w for w in info.warnings)
    tok.pad_token = tok.eos_token
    info = describe(tok, "x", "fp")
    assert any("PAD is EOS" in w for w in info.warnings)


@pytest.mark.slow
def test_unreachable_hub_tokenizer_is_a_clear_error(tmp_path):
    from conftest import run_offline

    out = run_offline(
        "from moai.stages.tokenizer import load_tokenizer\nload_tokenizer('nobody/no-such-tokenizer-xyz')", tmp_path
    )
    assert out.returncode != 0
    assert "ConfigError: tokenizer.path nobody/no-such-tokenizer-xyz: no such folder" in out.stderr
    assert "not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in out.stderr


def test_the_reference_is_loaded_as_the_config_says(tmp_path, tokenizer_dir):
    """tokenize compares with transformers loading the stored copy the same way the config loads
    the tokenizer (trust_remote_code included), or a remote-code tokenizer could not be checked."""
    from conftest import config_dict
    from moai.config import parse_config
    from moai.stages.tokenizer import info_of

    for trust in (False, True):
        cfg = parse_config(
            config_dict(tmp_path, tmp_path / "c.jsonl", {"path": str(tokenizer_dir), "trust_remote_code": trust})
        )
        assert info_of(cfg, tokenizer_dir, "k").trust_remote_code is trust


def test_a_mixed_tokenizer_sample_follows_the_weights_in_bytes():
    from moai.stages.tokenizer import weighted_rows

    sizes = {"ko": [10] * 100, "en": [20] * 10, "code": [5] * 1000}
    take = weighted_rows(sizes, {"ko": 2, "en": 1, "code": 1}, None)
    assert take == {"en": 10, "ko": 40, "code": 40}  # en's 200 bytes are the scarcest: ko 400, code 200
    assert sum(weighted_rows(sizes, {"ko": 2, "en": 1, "code": 1}, 45).values()) <= 45
    assert weighted_rows({"a": [5], "b": [1000]}, {"a": 1, "b": 1}, None) == {"a": 1, "b": 1}  # at least one each


def test_a_local_tokenizer_is_adopted_by_copy_and_loaded_once_per_content(tmp_path):
    from moai.stages.tokenizer import adopt_tokenizer, loaded_tokenizer

    folder = train_bpe(tmp_path / "t", make_texts(200), vocab_size=300)
    out = tmp_path / "adopted"
    out.mkdir()
    report = adopt_tokenizer(str(folder), out)
    assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert report["eos_id"] == load_tokenizer(str(folder)).eos_token_id
    published = tmp_path / "published"
    out.rename(published)
    (published / "_manifest.json").write_text("{}")  # the store's own file does not count
    tok = loaded_tokenizer(str(published))
    assert loaded_tokenizer(str(published)) is tok
    cfg_file = published / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["model_max_length"] = 77
    cfg_file.write_text(json.dumps(cfg))  # other content: loaded again
    again = loaded_tokenizer(str(published))
    assert again is not tok and again.model_max_length == 77


def test_the_backend_pipeline_is_written_out_once_and_shared(tokenizer_dir, bos_tokenizer_dir):
    """describe runs in the tokenizer and the tokenize stage and the tiktoken spec reads the same
    pipeline: one JSON text per loaded tokenizer, its parsed form and Rust object reused, and
    anything else (another text, a backend with truncation set) made anew."""
    from moai.stages import tokenizer as tokenizer_stage

    tok = load_tokenizer(str(tokenizer_dir))
    text = describe(tok, "a", "fp").backend_json
    assert describe(tok, "b", "fp2").backend_json is text
    assert text == tok.backend_tokenizer.to_str()  # neither truncation nor padding: the text as is
    parsed = json.loads(text)
    assert parsed["truncation"] is None and parsed["padding"] is None
    assert tokenizer_stage.parsed_backend(text) == parsed
    assert tokenizer_stage.parsed_backend(text) is tokenizer_stage.parsed_backend(text)  # parsed once
    assert tokenizer_stage.rust_backend(text) is tok.backend_tokenizer
    assert tokenizer_stage.rust_backend(json.dumps(parsed)) is not tok.backend_tokenizer  # another text
    tok.backend_tokenizer.enable_truncation(4)  # as a saved tokenizer.json may carry
    try:
        fresh = tokenizer_stage.rust_backend(text)
        assert fresh is not tok.backend_tokenizer and fresh.truncation is None
        assert len(fresh.encode("a b c d e f g h").ids) > 4
    finally:
        tok.backend_tokenizer.no_truncation()
    other = load_tokenizer(str(bos_tokenizer_dir))
    other_text = describe(other, "c", "fp3").backend_json
    assert other_text != text and tokenizer_stage.parsed_backend(text) == parsed  # parsed again, not mixed up


def test_freed_memory_is_given_back_to_the_system():
    """`release_freed_memory` returns what was freed inside the heap (glibc keeps it otherwise: a
    block still in use above it stops the heap from shrinking by itself)."""
    import ctypes

    import psutil

    from moai.stages.tokenizer import release_freed_memory

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(4096) for _ in range(50_000)]  # 200 MB in small blocks, on the heap
    for b in blocks:
        ctypes.memset(b, 1, 4096)
    keep = libc.malloc(4096)  # above them: the heap cannot shrink past it
    for b in blocks:
        libc.free(b)
    before = psutil.Process().memory_info().rss
    release_freed_memory()
    after = psutil.Process().memory_info().rss
    libc.free(keep)
    assert before - after > 100 << 20, (before >> 20, after >> 20)
