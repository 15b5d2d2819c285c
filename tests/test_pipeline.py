"""The stages chained: outputs open with the documented readers; one changed setting rebuilds
only what is downstream of it; a warm rerun builds nothing."""

import json
from pathlib import Path

import datasets

from conftest import config_dict, make_texts, write_jsonl
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


# -- several sources (`sources:`, the mix stage) ---------------------------------------------------


def _mixed(tmp_path, tokenizer, weights: dict[str, float], **extra) -> dict:
    from mixed_sources import source_texts

    sources = []
    for name, weight in weights.items():
        path = tmp_path / "data" / name / "corpus.jsonl"
        if not path.exists():
            write_jsonl(path, [{"text": t} for t in source_texts(name, 200)])
        sources.append({"name": name, "path": str(path), "weight": weight, "max_repetition": 3})
    return {
        "cache_dir": str(tmp_path / "cache"),
        "sources": sources,
        "tokenizer": tokenizer,
        "pack": {"seq_len": 32},
        "mix": {"total_tokens": 400 * 32},
        **extra,
    }


def test_one_weight_rebuilds_only_the_mix_and_a_new_source_only_its_own_chain(tmp_path, tokenizer_dir):
    tok = {"path": str(tokenizer_dir)}
    first = prepare(parse_config(_mixed(tmp_path, tok, {"ko": 0.6, "code": 0.3, "en": 0.1})), progress=False)
    chains = {f"{s}[{n}]" for s in ("convert", "filter", "save", "tokenize") for n in ("ko", "code", "en")}
    assert built(first) == chains | {"tokenizer", "mix"}
    assert "pack" not in first["stages"]

    reweighted = prepare(parse_config(_mixed(tmp_path, tok, {"ko": 0.5, "code": 0.3, "en": 0.2})), progress=False)
    assert built(reweighted) == {"mix"}
    assert [r["samples"] for r in reweighted["mix"]["sources"]] == [200, 120, 80]

    wider = _mixed(tmp_path, tok, {"ko": 0.5, "code": 0.3, "en": 0.1, "more": 0.1})
    added = prepare(parse_config(wider), progress=False)
    assert built(added) == {"convert[more]", "filter[more]", "save[more]", "tokenize[more]", "mix"}
    for name in ("ko", "code", "en"):
        assert added["stages"][f"tokenize[{name}]"]["key"] == first["stages"][f"tokenize[{name}]"]["key"]


def test_a_source_in_sources_has_the_keys_it_has_alone(tmp_path, tokenizer_dir):
    """Moving a source from `source:` into `sources:` reuses its chain: the same keys, nothing rebuilt."""
    tok = {"path": str(tokenizer_dir)}
    mixed = _mixed(tmp_path, tok, {"ko": 0.6, "code": 0.4})
    alone = {"cache_dir": mixed["cache_dir"], "source": {"path": mixed["sources"][0]["path"]}, "tokenizer": tok}
    single = prepare(parse_config({**alone, "pack": {"seq_len": 32}}), progress=False)
    both = prepare(parse_config(mixed), progress=False)
    for stage in ("convert", "filter", "save", "tokenize"):
        assert both["stages"][f"{stage}[ko]"] == {**single["stages"][stage], "built": False}
    assert not both["stages"]["tokenizer"]["built"]


def test_single_source_keys_are_unchanged(tmp_path):
    """A single `source:` keys every stage as moai did before `sources:` existed, so caches are reused
    (these keys were computed by the code before it; the corpus is the `corpus` fixture's bytes). They
    changed with the origin column (convert 3, filter 2, save 2, tokenize 3) and last with convert's
    record batches sized by the text too (convert 4): rebuilt once each time."""
    from moai.pipeline import StageResult, key_of, walk

    corpus = write_jsonl(
        tmp_path / "data" / "corpus.jsonl", [{"id": i, "text": t} for i, t in enumerate(make_texts(1500, seed=3))]
    )
    cfg = parse_config(config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}}))
    keys = {n: r.key for n, r in walk(cfg, lambda n, i: StageResult(n, key_of(cfg, n, i), "", {}, False)).items()}
    assert keys == {
        "convert": "1ab9d53c60b87d6c8c1c",
        "filter": "dffa9c22ba1c9cddc74d",
        "save": "e59a0ebb7cc5a30f62c0",
        "tokenizer": "21342bcfe6f53463c3c3",
        "tokenize": "879c2d6ed167d1ad0a72",
        "pack": "e8dbf343c92da646e946",
    }


def test_a_tokenizer_trained_on_several_sources_and_their_units_merged(tmp_path):
    from moai.pipeline import merge, tokenize_shard

    cfg = parse_config(_mixed(tmp_path, {"train": {"vocab_size": 400}}, {"ko": 0.5, "code": 0.5}))
    units = [tokenize_shard(cfg, i, 2) for i in range(2)]
    assert all(set(u["sources"]) == {"ko", "code"} for u in units)
    merged = merge(cfg, 2)
    report = json.loads((Path(merged["tokenizer"]) / "_manifest.json").read_text())["report"]
    assert set(report["documents_by_source"]) == {"ko", "code"} and min(report["documents_by_source"].values()) > 0
    assert merged["mix"]["tokens"] == 400 * 32
    assert built(prepare(cfg, progress=False)) == set()
