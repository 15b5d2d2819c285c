"""The stages chained: outputs open with the documented readers; one changed setting rebuilds
only what is downstream of it; a warm rerun builds nothing."""

import json
from pathlib import Path

import datasets

from conftest import config_dict
from moai.config import parse_config
from moai.formats.tokens import PackedSamples, TokenStore
from moai.pipeline import prepare


def built(result):
    return {name for name, s in result["stages"].items() if s["built"]}


def test_prepare_end_to_end_then_warm(tmp_path, corpus):
    cfg = parse_config(config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}}))
    cold = prepare(cfg, progress=False)
    assert built(cold) == {"convert", "filter", "save", "tokenizer", "tokenize", "pack"}

    # every text stage opens with load_from_disk; the token store with its reader
    for stage in ("convert", "filter", "save"):
        key = cold["stages"][stage]["key"]
        assert datasets.load_from_disk(str(tmp_path / "cache" / stage / key))
    store = TokenStore(cold["token_store"])
    assert cold["num_tokens"] == sum(store.split(s).num_tokens for s in store.splits)
    assert cold["num_documents"] == sum(store.split(s).num_documents for s in store.splits)
    samples = PackedSamples(cold["sample_index"], "train")
    assert len(samples) == store.split("train").num_tokens // 64
    first = samples[0]
    assert first["input_ids"].shape == (64,) and first["position_ids"][0] == 0
    manifest = json.loads(
        (tmp_path / "cache" / "tokenize" / cold["stages"]["tokenize"]["key"] / "_manifest.json").read_text()
    )
    assert manifest["report"]["tokens"] == cold["num_tokens"] and manifest["upstream"]

    warm = prepare(cfg, progress=False)
    assert built(warm) == set()
    assert {k: warm[k] for k in ("token_store", "sample_index", "num_tokens")} == {
        k: cold[k] for k in ("token_store", "sample_index", "num_tokens")
    }


def test_one_setting_rebuilds_only_downstream(tmp_path, corpus, tokenizer_dir):
    base = config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)})
    first = prepare(parse_config(base), progress=False)
    assert built(first) == {"convert", "filter", "save", "tokenizer", "tokenize", "pack"}  # given tokenizer copied in

    seq = prepare(parse_config({**base, "pack": {"seq_len": 32}}), progress=False)
    assert built(seq) == {"pack"}

    filt = prepare(parse_config({**base, "filter": {"min_chars": 20}}), progress=False)
    assert built(filt) == {"filter", "save", "tokenize", "pack"}

    split = prepare(parse_config({**base, "split": {"val_fraction": 0.2}}), progress=False)
    assert built(split) == {"save", "tokenize", "pack"}

    # the source's content is the root of every key
    corpus.write_text(corpus.read_text() + json.dumps({"text": "one more document"}) + "\n")
    grown = prepare(parse_config(base), progress=False)
    assert built(grown) == {"convert", "filter", "save", "tokenize", "pack"}  # same tokenizer files: reused
    assert grown["num_documents"] == first["num_documents"] + 1


def test_validation_split_is_disjoint_and_complete(tmp_path, corpus, tokenizer_dir):
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}, split={"val_fraction": 0.1}))
    out = prepare(cfg, progress=False)
    saved = datasets.load_from_disk(str(tmp_path / "cache" / "save" / out["stages"]["save"]["key"]))
    filtered = datasets.load_from_disk(str(tmp_path / "cache" / "filter" / out["stages"]["filter"]["key"]))
    assert saved["train"].num_rows + saved["validation"].num_rows == filtered.num_rows
    assert abs(saved["validation"].num_rows - round(0.1 * filtered.num_rows)) <= 1
    assert sorted(list(saved["train"]["text"]) + list(saved["validation"]["text"])) == sorted(filtered["text"])


def test_a_changed_tokenizer_rebuilds_tokenize_not_text(tmp_path, corpus, tokenizer_dir, bos_tokenizer_dir):
    import shutil

    mine = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, mine)
    base = config_dict(tmp_path, corpus, {"path": str(mine)})
    first = prepare(parse_config(base), progress=False)
    shutil.rmtree(mine)
    shutil.copytree(bos_tokenizer_dir, mine)  # same path, other content
    second = prepare(parse_config(base), progress=False)
    assert built(second) == {"tokenizer", "tokenize", "pack"}
    assert second["tokenizer"] != first["tokenizer"] and Path(first["tokenizer"]).is_dir()  # old copy kept
