"""Real `accelerate launch` runs on CPU over a mixed sample index (format 2, three real token stores):
training reads the stored order, logs tokens per source that are the index's prefix counts, and
evaluation loss per source; a stopped run resumes bit-identically; another mix is refused.
One test, so that its four launches share their set-up (70 to 110 s on 2 cores)."""

import json
import re

import numpy as np
import pytest

from mixed_sources import NAMES, launch_for, three_source_mix
from moai.launch import TrainingFailed, run_launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    """Three token stores and two mixed indexes of 150 train samples (90 ko, 45 code, 15 en): the same
    windows in two orders."""
    tok, stores, (index, other) = three_source_mix(tmp_path_factory.mktemp("mixrun"), seeds=(0, 1))
    return tok, stores, index, other


def train(mix, out, index=None, **train):
    """One launch; returns the records `run_launch` handed to on_metrics."""
    tok, stores, default, _ = mix
    records: list[dict] = []
    launch = launch_for(tok, stores, index or default, out, **train)
    run_launch(launch, on_line=lambda line: None, on_metrics=records.append)
    return records


def lines(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def prefix_counts(index, position):
    """Tokens per source over global positions [0, position), reading the stored order again and again."""
    rows = np.load(index / "train.npy")
    counts = dict.fromkeys(NAMES, 0)
    for p in range(position):
        k, _, length = rows[p % len(rows)]
        counts[NAMES[k]] += int(length)
    return counts


def test_a_mixed_run_logs_tokens_and_eval_loss_per_source_and_resumes_exactly(mix, tmp_path):
    _, _, index, other = mix
    whole = tmp_path / "whole"
    records = train(mix, whole, tracker="tensorboard")

    steps = [r for r in lines(whole) if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 25))  # 24 x 8 = 192 samples: past the 150 of one epoch
    for r in steps:
        assert r["tokens_by_source"] == prefix_counts(index, r["step"] * 8), r["step"]
        assert sum(r["tokens_by_source"].values()) == r["tokens"]
    assert records[-1]["event"] == "end" and [r for r in records if "loss" in r] == steps  # what on_metrics got

    evals = [r for r in lines(whole) if "eval_loss" in r]
    assert [r["step"] for r in evals] == [8, 16, 24]
    val = np.load(index / "validation.npy")
    counts = [min(int((val[:, 0] == k).sum()), 2 * 8) for k in range(3)]
    for r in evals:
        assert set(r) == {"step", "eval_loss", "eval_ppl", *(f"eval_loss/{n}" for n in NAMES)}
        pooled = sum(c * r[f"eval_loss/{n}"] for c, n in zip(counts, NAMES, strict=True)) / sum(counts)
        assert r["eval_loss"] == pytest.approx(pooled, abs=1e-5)
    start = next(r for r in lines(whole) if r.get("event") == "start")
    assert start["sources"] == NAMES and start["train_samples"] == 150
    first = json.loads((whole / "ranks" / "rank-0.json").read_text())["first_samples"]
    assert first == list(range(8))  # the stored order, not a shuffle
    events = b"".join(p.read_bytes() for p in (whole / "moai").rglob("events.out.tfevents.*"))
    for tag in ("tokens/ko", "tokens/code", "tokens/en", "eval_loss/ko", "eval_loss/en"):
        assert tag.encode() in events, tag

    split = tmp_path / "split"
    train(mix, split, stop_after_steps=10)
    assert max(r["step"] for r in lines(split) if "loss" in r) == 10
    # What a kill while step 10 was being saved leaves: steps 9-10 logged, the newest checkpoint step 8.
    (split / "checkpoints" / "step-00000010").rename(split / "checkpoints" / ".tmp-step-00000010")
    train(mix, split)  # resumes at step 8 (sample 64 of 150) and reads on into the second epoch
    ignore = {"tokens_per_s", "samples_per_s", "mfu"}

    def kept(out):
        return [{k: v for k, v in r.items() if k not in ignore} for r in lines(out) if "step" in r and "event" not in r]

    assert kept(split) == kept(whole)  # losses, grad norms, tokens per source and eval losses, bit for bit
    starts = [r for r in lines(split) if r.get("event") == "start"]
    assert [(s["resumed"], s["step"]) for s in starts] == [(False, 0), (True, 8)]

    # the same output_dir over another mix (same sources and counts, another order): the ranks refuse it
    with pytest.raises(TrainingFailed) as err:
        train(mix, split, other)
    assert re.search(
        r"sample order \(.*\) as-stored xxh3:\w+ in the checkpoint, as-stored xxh3:\w+ now", str(err.value)
    )
