"""The mix stage: three real sources through the real pipeline, each at exactly its share, capped,
interleaved evenly, refused when infeasible, and the same bytes for the same seed."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from conftest import write_jsonl
from mixed_sources import source_texts
from moai.config import parse_config
from moai.errors import DataError
from moai.formats.tokens import PackedSamples, TokenStore
from moai.pipeline import prepare
from moai.stages import mix

SEQ_LEN = 16
WEIGHTS = {"ko": 0.6, "code": 0.3, "en": 0.1}
DOCS = {"ko": 120, "code": 400, "en": 300}  # ko is small: at 0.6 of the budget it must repeat


def write_sources(root: Path, docs: dict[str, int] = DOCS) -> dict[str, Path]:
    return {
        name: write_jsonl(root / "data" / name / "corpus.jsonl", [{"text": t} for t in source_texts(name, n)])
        for name, n in docs.items()
    }


def mix_config(root: Path, files: dict[str, Path], tokenizer: Path, weights=WEIGHTS, reps=None, **extra) -> dict:
    reps = reps if reps is not None else {"ko": 8}
    return {
        "cache_dir": str(root / "cache"),
        "sources": [
            {"name": n, "path": str(files[n]), "weight": weights[n], "max_repetition": reps.get(n, 1)} for n in weights
        ],
        "tokenizer": {"path": str(tokenizer)},
        "pack": {"seq_len": SEQ_LEN},
        "split": {"val_fraction": 0.05},
        **extra,
    }


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    return write_sources(tmp_path)


def windows_of(result: dict, name: str, split: str = "train") -> int:
    return TokenStore(result["token_stores"][name]).split(split).num_tokens // SEQ_LEN


def test_three_sources_at_their_shares_capped_and_interleaved(tmp_path, files, tokenizer_dir):
    cfg = parse_config(mix_config(tmp_path, files, tokenizer_dir, mix={"total_tokens": 2500 * SEQ_LEN}))
    out = prepare(cfg, progress=False)
    index = np.load(Path(out["sample_index"]) / "train.npy")
    assert index.shape == (2500, 3) and index.dtype == np.int64
    assert (index[:, 2] == SEQ_LEN).all() and (index[:, 1] % SEQ_LEN == 0).all()

    rows = {r["name"]: r for r in out["mix"]["sources"]}
    assert out["mix"]["tokens"] == 2500 * SEQ_LEN and out["num_samples"]["train"] == 2500
    assert rows["ko"]["epochs"] > 1  # the budget forced ko to repeat
    for k, name in enumerate(WEIGHTS):
        r, n = rows[name], windows_of(out, name)
        got = int((index[:, 0] == k).sum())
        assert got == r["samples"] and r["realised_tokens"] == got * SEQ_LEN
        assert abs(r["realised_tokens"] - WEIGHTS[name] * 2500 * SEQ_LEN) < SEQ_LEN  # within one sample
        assert r["windows_available"] == n and got <= n * (8 if name == "ko" else 1)  # under its cap
        uses = np.bincount(index[index[:, 0] == k, 1] // SEQ_LEN, minlength=n)
        assert uses.max() - uses.min() <= 1  # whole passes first: no window twice before every window once
        assert uses.max() <= (8 if name == "ko" else 1)

    # every 1,000 consecutive samples hold each source's share within ±1 percentage point
    for k, name in enumerate(WEIGHTS):
        hits = np.concatenate([[0], np.cumsum(index[:, 0] == k)])
        per_window = hits[1000:] - hits[:-1000]
        assert np.abs(per_window / 1000 - WEIGHTS[name]).max() <= 0.01

    samples = PackedSamples(out["sample_index"], "train")
    assert samples.source_names == list(WEIGHTS) and len(samples) == 2500
    for i in (0, 1, 2, 1234, 2499):
        k, start, length = (int(x) for x in index[i])
        assert samples.source(i) == list(WEIGHTS)[k]
        expected = TokenStore(out["token_stores"][samples.source(i)]).split("train").tokens(start, start + length)
        assert np.array_equal(samples[i]["input_ids"], expected)

    # validation: every validation window of every source, labelled, source after source
    val = np.load(Path(out["sample_index"]) / "validation.npy")
    assert [int((val[:, 0] == k).sum()) for k in range(3)] == [windows_of(out, n, "validation") for n in WEIGHTS]
    assert (np.diff(val[:, 0]) >= 0).all()
    meta = json.loads((Path(out["sample_index"]) / "pack.json").read_text())
    assert meta["format"] == "moai-sample-index/2" and meta["order"] == "as-stored" and meta["mode"] == "mix"
    assert [s["name"] for s in meta["sources"]] == list(WEIGHTS)
    assert meta["splits"] == {"train": 2500, "validation": len(val)}


def test_an_infeasible_mix_is_refused_naming_the_source_and_each_fix_fits(tmp_path, files, tokenizer_dir):
    budget = {"total_tokens": 1000 * SEQ_LEN}  # ko (440 windows), never repeated, cannot give 600
    with pytest.raises(DataError, match=r"source 'ko' has [\d,]+ full windows of 16 tokens .* needs 9,600") as err:
        prepare(parse_config(mix_config(tmp_path, files, tokenizer_dir, reps={}, mix=budget)), progress=False)
    message = str(err.value)
    assert "\n" not in message
    weight = float(message.split("weight ≤ ")[1].split(" ")[0])
    reps = float(message.split("max_repetition ≥ ")[1].split(" ")[0])
    total = int(message.split("mix.total_tokens ≤ ")[1].replace(",", ""))
    fits = [
        mix_config(tmp_path, files, tokenizer_dir, weights={**WEIGHTS, "ko": weight}, reps={}, mix=budget),
        mix_config(tmp_path, files, tokenizer_dir, reps={"ko": reps}, mix=budget),
        mix_config(tmp_path, files, tokenizer_dir, reps={}, mix={"total_tokens": total}),
    ]
    for cfg in fits:
        ko = prepare(parse_config(cfg), progress=False)["mix"]["sources"][0]
        assert ko["epochs"] <= cfg["sources"][0]["max_repetition"]
    # each fix is the nearest that fits: a little more of any is refused
    nearest = [
        mix_config(tmp_path, files, tokenizer_dir, weights={**WEIGHTS, "ko": weight * 1.01}, reps={}, mix=budget),
        mix_config(tmp_path, files, tokenizer_dir, reps={"ko": reps - 0.01}, mix=budget),
        mix_config(tmp_path, files, tokenizer_dir, reps={}, mix={"total_tokens": total + SEQ_LEN}),
    ]
    for cfg in nearest:
        with pytest.raises(DataError, match="source 'ko'"):
            prepare(parse_config(cfg), progress=False)


def test_the_same_seed_gives_the_same_bytes(tmp_path, files, tokenizer_dir):
    cfg = parse_config(mix_config(tmp_path, files, tokenizer_dir, mix={"total_tokens": 1500 * SEQ_LEN}))
    out = prepare(cfg, progress=False)
    stores = [Path(out["token_stores"][n]) for n in WEIGHTS]

    def build(seed: int) -> bytes:
        folder = tmp_path / f"mix-{seed}-{len(list(tmp_path.glob('mix-*')))}"
        folder.mkdir()
        c = cfg.model_copy(update={"mix": cfg.mix.model_copy(update={"seed": seed})})
        mix.mix(c, stores, folder, cache_root=tmp_path / "cache", total=1500 * SEQ_LEN, total_from="test")
        return (folder / "train.npy").read_bytes()

    first = build(0)
    assert build(0) == first
    assert first == (Path(out["sample_index"]) / "train.npy").read_bytes()
    assert build(1) != first


@pytest.mark.parametrize("weights", [[1, 1, 1], [0.6, 0.3, 0.1], [0.97, 0.02, 0.01], [5, 3, 2, 1]])
@pytest.mark.parametrize("num", [1, 7, 1000, 12345])
def test_allot_is_largest_remainder(weights, num):
    shares = [Fraction(w) / sum(Fraction(x) for x in weights) for w in weights]
    counts = mix.allot(shares, num)
    assert sum(counts) == num
    for c, s in zip(counts, shares, strict=True):
        assert abs(c - s * num) < 1


@pytest.mark.parametrize("counts", [[600, 300, 100], [9700, 200, 100], [1, 1, 1], [5000, 0, 5000], [3333, 3333, 3334]])
def test_the_schedule_spreads_every_source_evenly(counts):
    order = mix.interleave(counts)
    times = np.concatenate([(np.arange(n) + 0.5) / n for n in counts if n])
    assert np.array_equal(order, np.argsort(times, kind="stable"))  # counted slots = the sort by ideal time
    source = np.repeat(np.arange(len(counts)), counts)[order]
    total = sum(counts)
    for k, n in enumerate(counts):
        hits = np.concatenate([[0], np.cumsum(source == k)])
        width = min(1000, total)
        per_window = hits[width:] - hits[: len(hits) - width]
        assert np.abs(per_window - width * n / total).max() <= 2  # within two samples of its share


def test_passes_use_every_window_before_any_twice():
    chosen = mix.passes(10, 25, seed=0, name="ko")
    assert sorted(chosen[:10].tolist()) == list(range(10)) and sorted(chosen[10:20].tolist()) == list(range(10))
    assert len(set(chosen[20:].tolist())) == 5
    assert np.array_equal(chosen, mix.passes(10, 25, seed=0, name="ko"))
    assert not np.array_equal(chosen, mix.passes(10, 25, seed=1, name="ko"))


def test_a_source_without_a_window_is_named_with_what_fits():
    with pytest.raises(
        DataError, match=r"source 'en' has 0 full windows .* add data to 'en' or remove it from sources$"
    ):
        mix.refuse(["ko", "en"], [0.5, 0.5], [1, 1], [100, 0], mix.allot([Fraction(1, 2)] * 2, 50), 16)
