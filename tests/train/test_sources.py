"""Pure parts of training on a mixed index: the stored order, tokens per source over the positions
read, what the run identity says of the order, and the tracker's names for per-source figures."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from moai.config import ConfigError, parse_config
from moai.train.checkpoint import resume_plan, run_identity
from moai.train.data import SourceTokens, StepBatches, epoch_order, order_of, sample_ids

BASE = {"source": {"path": "x"}, "tokenizer": {"path": "t"}}


def train_cfg(**train):
    return parse_config({**BASE, "train": {"model_config": {"model_type": "llama"}, **train}}).train


def read_order(n, world, micro, accum, steps, order="as-stored", seed=0):
    """Per step, each rank's sample ids, as StepBatches yields them."""
    t = train_cfg(micro_batch_size=micro, grad_accum_steps=accum, max_steps=steps, seed=seed)
    ranks = [list(StepBatches(t, n, r, world, 0, None, order)) for r in range(world)]
    return [[ids for r in range(world) for ids in ranks[r][s * accum : (s + 1) * accum]] for s in range(steps)]


@settings(deadline=None, max_examples=30)
@given(n=st.integers(3, 60), world=st.integers(1, 4), micro=st.integers(1, 4), accum=st.integers(1, 3))
def test_a_stored_order_is_read_as_stored_every_epoch_and_sharded_by_rank(n, world, micro, accum):
    per_step = world * micro * accum
    steps = -(-2 * n // per_step) + 1  # past the second epoch
    t = train_cfg(micro_batch_size=micro, grad_accum_steps=accum, max_steps=steps)
    by_position = {}
    for r in range(world):
        for k, ids in enumerate(StepBatches(t, n, r, world, 0, None, "as-stored")):
            step, m = divmod(k, accum)
            base = ((step * accum + m) * world + r) * micro
            by_position.update({base + j: i for j, i in enumerate(ids)})
    assert [by_position[p] for p in range(len(by_position))] == [p % n for p in range(len(by_position))]
    # a rank resumed at step S reads what it would have read uninterrupted
    resumed = list(StepBatches(t, n, world - 1, world, steps - 1, None, "as-stored"))
    assert resumed == list(StepBatches(t, n, world - 1, world, 0, None, "as-stored"))[-accum:]


def test_format_1_order_is_unchanged():
    t = train_cfg(micro_batch_size=3, max_steps=40, seed=5)
    got = list(StepBatches(t, 50, 0, 1, 0))
    assert got == [sample_ids(5, 50, s, 0, 0, 1, 3, 1) for s in range(40)]
    assert got[:3] == [epoch_order(5, 0, 50)[i : i + 3].tolist() for i in (0, 3, 6)]
    assert list(StepBatches(t, 50, 0, 1, 0, None, "shuffle")) == got


def brute_force(names, ids, lengths, order, position):
    n, out = len(ids), dict.fromkeys(names, 0)
    for p in range(position):
        epoch, i = divmod(p, n)
        s = i if order is None else int(order(epoch)[i])
        out[names[ids[s]]] += int(lengths[s])
    return out


@settings(deadline=None, max_examples=40)
@given(
    rows=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 9)), min_size=1, max_size=40),
    stops=st.lists(st.integers(0, 130), min_size=1, max_size=6),
    shuffled=st.booleans(),
)
def test_tokens_by_source_equal_the_prefix_counts_whatever_the_calls(rows, stops, shuffled):
    names = ["ko", "code", "en"]
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    lengths = np.array([r[1] for r in rows], dtype=np.int64)
    order = order_of(train_cfg(seed=3), len(ids), 1) if shuffled else None
    counter = SourceTokens(names, ids, lengths, order)
    for stop in stops:  # forwards, backwards (a resume), across epochs
        fresh = SourceTokens(names, ids, lengths, order).upto(stop)
        assert counter.upto(stop) == fresh == brute_force(names, ids, lengths, order, stop)


def test_counting_a_step_costs_microseconds_and_a_resume_milliseconds():
    import time

    n = 1_000_000
    rng = np.random.default_rng(0)
    ids, lengths = rng.integers(0, 3, n), np.full(n, 2048)
    counter = SourceTokens(["ko", "code", "en"], ids, lengths)
    started = time.perf_counter()
    for step in range(1, 1001):
        counter.upto(step * 64)
    per_step = (time.perf_counter() - started) / 1000
    started = time.perf_counter()
    SourceTokens(["ko", "code", "en"], ids, lengths).upto(3 * n + n // 2)  # a resume in the 4th epoch
    assert per_step < 1e-3 and time.perf_counter() - started < 1.0


def _checkpoint(out, run):
    folder = out / "checkpoints" / "step-00000004"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"step": 4, "samples_consumed": 0, "tokens_consumed": 0, "run": run}))


def test_the_run_identity_carries_the_sample_order(tmp_path):
    out = tmp_path / "run"
    config = parse_config(
        {**BASE, "train": {"model_config": {"model_type": "llama"}, "output_dir": str(out), "max_steps": 10}}
    )
    t = config.train
    old = run_identity(t, 1, config.pack.seq_len, 100)
    del old["sample_order"]  # written before the entry existed: every run was shuffled
    _checkpoint(out, old)
    assert resume_plan(config, num_samples=100, sample_order="shuffle").status == "resume"
    with pytest.raises(ConfigError, match=r"sample order \(.*\) shuffle in the checkpoint, as-stored xxh3:ab now"):
        resume_plan(config, num_samples=100, sample_order="as-stored xxh3:ab")

    mixed = tmp_path / "mixed"
    config = config.model_copy(update={"train": t.model_copy(update={"output_dir": str(mixed)})})
    _checkpoint(mixed, run_identity(t, 1, config.pack.seq_len, 100, "as-stored xxh3:ab"))
    assert resume_plan(config, num_samples=100).status == "resume"  # the order not known yet
    assert resume_plan(config, num_samples=100, sample_order="as-stored xxh3:ab").status == "resume"
    with pytest.raises(ConfigError) as err:
        resume_plan(config, num_samples=100, sample_order="as-stored xxh3:cd")
    assert "as-stored xxh3:ab in the checkpoint, as-stored xxh3:cd now" in str(err.value)
    assert "\n" not in str(err.value)


def test_sample_order_identity_reads_the_manifest_digest_or_hashes(tmp_path):
    from moai.store import MANIFEST, file_digest
    from moai.train.data import sample_order_identity

    folder = tmp_path / "cache" / "mix" / "k"
    folder.mkdir(parents=True)
    np.save(folder / "train.npy", np.zeros((0, 3), dtype=np.int64))
    store = tmp_path / "cache" / "tokenize" / "s"
    store.mkdir(parents=True)
    (store / "tokens.json").write_text(
        json.dumps(
            {
                "format": "moai-token-store/1",
                "dtype": "<u2",
                "eos_id": 0,
                "vocab_size": 10,
                "splits": {"train": {"parts": [], "num_tokens": 0, "num_documents": 0}},
            }
        )
    )
    meta = {"format": "moai-sample-index/2", "seq_len": 8, "mode": "mix", "order": "as-stored"}
    meta |= {"sources": [{"name": "a", "token_store": "tokenize/s"}, {"name": "b", "token_store": "tokenize/s"}]}
    (folder / "pack.json").write_text(json.dumps({**meta, "splits": {"train": 0}}))
    assert sample_order_identity(folder) == f"as-stored xxh3:{file_digest(folder / 'train.npy')}"
    (folder / MANIFEST).write_text(json.dumps({"files": {"train.npy": {"bytes": 1, "xxh3_128": "f00"}}}))
    assert sample_order_identity(folder) == "as-stored xxh3:f00"
    assert sample_order_identity(None) == "shuffle"
