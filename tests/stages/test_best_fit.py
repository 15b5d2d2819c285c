"""pack.mode best_fit: documents whole in seq_len rows by best-fit decreasing, checked against the
one-item-at-a-time rule, on realistic lengths against the padding target, through the real
pipeline (one source, and several through the mix stage) and into training labels."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from conftest import config_dict
from moai.config import parse_config
from moai.formats.tokens import PackedSamples, TokenStore
from moai.pipeline import prepare
from moai.stages.pack import best_fit, best_fit_report, best_fit_rows, place


def one_at_a_time(lengths: list[int], seq_len: int) -> list[int]:
    """Best-fit decreasing as written in the textbook: the free space of every row, sorted."""
    free: list[int] = []
    for x in sorted(lengths, reverse=True):
        fits = [r for r, f in enumerate(free) if f >= x]
        if fits:
            best = min(fits, key=lambda r: free[r])
            free[best] -= x
        else:
            free.append(seq_len - x)
    return sorted(free)


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, 200), min_size=0, max_size=120), seq_len=st.integers(2, 90))
def test_every_token_once_documents_whole_rows_as_textbook_best_fit(lengths, seq_len):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    pieces, row_offsets = best_fit(offsets, seq_len)
    covered = np.zeros(int(offsets[-1]), dtype=np.int64)
    for start, length in pieces:
        covered[start : start + length] += 1
    assert (covered == 1).all()  # every token exactly once
    loads = np.add.reduceat(pieces[:, 1], row_offsets[:-1]) if len(pieces) else np.empty(0)
    assert (loads <= seq_len).all() and (np.diff(row_offsets) >= 1).all()
    # a document no longer than seq_len is one piece; a longer one: its seq_len pieces and a tail
    starts = set(pieces[:, 0].tolist())
    for a, n in zip(offsets[:-1].tolist(), lengths, strict=True):
        assert {a + k * seq_len for k in range(-(-n // seq_len))} <= starts
    # the tails and short documents go where the textbook rule puts them (same row loads)
    items = [n % seq_len for n in lengths if n % seq_len]
    rows = place(np.array(sorted(items, reverse=True), dtype=np.int64), seq_len)
    got = seq_len - np.bincount(rows, weights=sorted(items, reverse=True)).astype(int)
    assert sorted(got.tolist()) == one_at_a_time(items, seq_len)


def test_realistic_lengths_pad_under_a_tenth_of_a_percent():
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, rng.lognormal(6.0, 1.2, 20_000)).astype(np.int64)  # median ~400, long tail
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rows, pieces = best_fit_rows(offsets, 2048)
    report = best_fit_report(rows, offsets, 2048)
    assert report["padding_fraction"] <= 0.001
    assert report["documents_split"] == int((lengths > 2048).sum())  # only those longer than a row
    assert int(rows[:, 3].sum()) == int(offsets[-1]) == int(pieces[:, 2].sum())


def check_rows(samples: PackedSamples, stores: list[TokenStore], split: str) -> None:
    """Every document of every store, token for token, exactly once, with its loss mask and positions."""
    seen = [np.zeros(s.split(split).num_tokens, dtype=np.int64) for s in stores]
    for i in range(len(samples)):
        item = samples[i]
        used = int(samples.samples[i, 3])
        assert len(item["input_ids"]) == samples.seq_len
        assert item["loss_mask"].tolist() == [1] * used + [0] * (samples.seq_len - used)
        at = 0
        for k, start, length in samples.row(i).tolist():
            tokens = samples.token_splits[k]
            assert np.array_equal(item["input_ids"][at : at + length], tokens.tokens(start, start + length))
            assert item["position_ids"][at : at + length].tolist() == list(range(length))
            seen[k][start : start + length] += 1
            at += length
        assert item["position_ids"][used:].tolist() == list(range(samples.seq_len - used))  # padding: its own
    assert all((s == 1).all() for s in seen)


def test_one_source_through_the_pipeline_into_labels(tmp_path, corpus, tokenizer_dir):
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}, pack={"mode": "best_fit"}))
    out = prepare(cfg, progress=False)
    index = Path(out["sample_index"])
    meta = json.loads((index / "pack.json").read_text())
    assert meta["format"] == "moai-sample-index/3" and meta["mode"] == "best_fit" and meta["order"] == "shuffle"
    report = json.loads((index / "_manifest.json").read_text())["report"]
    assert report["mode"] == "best_fit" and report["padding_fraction"] == report["splits"]["train"]["padding_fraction"]
    store = TokenStore(out["token_store"])
    for split in ("train", "validation"):
        samples = PackedSamples(index, split)
        check_rows(samples, [store], split)
        offsets = store.split(split).doc_offsets
        whole = {(int(a), int(b - a)) for a, b in itertools.pairwise(offsets) if b - a <= 64}
        pieces = {(int(s), int(n)) for _, s, n in samples.pieces.tolist()}
        assert whole <= pieces  # documents up to seq_len are whole
        assert report["splits"][split]["samples"] == len(samples)
        assert report["splits"][split]["documents_split"] == int((np.diff(offsets) > 64).sum())

    from moai.errors import DataError
    from moai.formats.webdataset import export_webdataset
    from moai.train.data import PackedDataset

    try:
        export_webdataset(index, tmp_path / "wds")
        raise AssertionError("a best_fit index was exported")
    except DataError as err:
        assert "pack.mode best_fit" in str(err) and "\n" not in str(err)
    data = PackedDataset(str(index), "train")
    for i in range(len(data)):
        item, used = data[i], int(data.samples.samples[i, 3])
        assert (item["labels"][used:] == -100).all() and (item["labels"][:used] == item["input_ids"][:used]).all()


def test_several_sources_mix_best_fit_rows(tmp_path, tokenizer_dir):
    from test_mix import SEQ_LEN, WEIGHTS, mix_config, write_sources

    files = write_sources(tmp_path)
    raw = mix_config(tmp_path, files, tokenizer_dir, mix={"total_tokens": 800 * SEQ_LEN})
    raw["pack"]["mode"] = "best_fit"
    out = prepare(parse_config(raw), progress=False)
    index = Path(out["sample_index"])
    meta = json.loads((index / "pack.json").read_text())
    assert meta["format"] == "moai-sample-index/3" and meta["order"] == "as-stored"
    samples = PackedSamples(index, "train")
    assert len(samples) == 800 and samples.source_names == list(WEIGHTS)
    stores = [TokenStore(out["token_stores"][n]) for n in WEIGHTS]
    # each row is of one source, whole documents of that source's train split
    for i in range(0, 800, 7):
        k = int(samples.samples[i, 0])
        assert set(samples.row(i)[:, 0].tolist()) == {k}
    rows = {r["name"]: r for r in out["mix"]["sources"]}
    for k, name in enumerate(WEIGHTS):
        mine = samples.samples[samples.samples[:, 0] == k]
        assert rows[name]["samples"] == len(mine) and rows[name]["realised_tokens"] == int(mine[:, 3].sum())
        assert abs(len(mine) - WEIGHTS[name] * 800) < 1
    # validation: every source's validation documents once
    check_rows(PackedSamples(index, "validation"), stores, "validation")
