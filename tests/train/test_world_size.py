"""Resume on another allocation: the same global batch split another way (2 CPU ranks, then 1 rank
with twice the accumulation) reads the same samples each step as an uninterrupted run, so the
losses agree; another global batch is refused before launch, naming it."""

import json

import numpy as np
import pytest
from test_run import config, learnable, losses, moai_train  # noqa: F401  (learnable: the corpus fixture)

from conftest import ROOT
from moai.config import ConfigError, parse_config

pytestmark = pytest.mark.slow


def step_samples(seed, n, step, mb, accum, world):
    from moai.train.data import sample_ids

    return sorted(
        i for m in range(accum) for r in range(world) for i in sample_ids(seed, n, step, m, r, world, mb, accum)
    )


@pytest.mark.parametrize(("a", "b"), [((4, 1, 2), (4, 2, 1)), ((2, 4, 1), (8, 1, 1)), ((1, 2, 4), (2, 2, 2))])
def test_every_split_of_a_global_batch_reads_the_same_samples_each_step(a, b):
    for step in (0, 1, 7, 40):  # 40 x 8 > 100 samples: later epochs too
        assert step_samples(3, 100, step, *a) == step_samples(3, 100, step, *b)


def test_two_ranks_then_one_with_doubled_accumulation_matches_one_rank(learnable, tmp_path):  # noqa: F811
    root, corpus, tok = learnable
    whole, moved = tmp_path / "whole", tmp_path / "moved"
    common = {"max_steps": 12, "save_every": 3, "micro_batch_size": 4}
    moai_train(config(root, corpus, tok, whole, num_processes=1, grad_accum_steps=2, **common), tmp_path)
    moai_train(config(root, corpus, tok, moved, num_processes=2, stop_after_steps=6, **common), tmp_path)
    assert max(losses(moved)) == 6 and not (moved / "final").exists()
    resumed = moai_train(config(root, corpus, tok, moved, num_processes=1, grad_accum_steps=2, **common), tmp_path)
    a, b = losses(whole), losses(moved)
    assert sorted(a) == sorted(b) == list(range(1, 13))
    diffs = {s: abs(a[s] - b[s]) for s in a}
    print("loss differences per step:", json.dumps(diffs))
    assert max(diffs.values()) < 1e-3, diffs
    records = [json.loads(line) for line in (moved / "metrics.jsonl").read_text().splitlines()]
    starts = [r for r in records if r.get("event") == "start"]
    assert [(s["world_size"], s["resumed"]) for s in starts] == [(2, False), (1, True)] and starts[1]["step"] == 6
    assert "resum" in resumed.stdout + resumed.stderr

    # another global batch (1 rank, accumulation unchanged: 4 samples a step, not 8) is refused before launch
    from moai.train.checkpoint import resume_plan

    cfg = parse_config(config(root, corpus, tok, moved, num_processes=1, **{**common, "max_steps": 20}))
    with pytest.raises(ConfigError, match=r"global batch .* 8 in the checkpoint, 4 now"):
        resume_plan(cfg)
    assert np.isfinite(list(b.values())).all()


def test_chat_best_fit_rows_resume_with_another_micro_batch_split(learnable, tmp_path):  # noqa: F811
    """Rows with different numbers of labels (chat loss masks, best_fit padding): 2 ranks x 2
    samples, then 1 rank x 1 sample x 4 micro-batches, against 1 rank x 4 samples: the loss is the
    mean over the global batch's labels, so the split does not weigh tokens differently."""
    root, _, _ = learnable
    examples = ROOT / "examples"

    def chat(out, **train):
        cfg = config(root, examples / "chat" / "conversations.jsonl", examples / "tokenizer", out, **train)
        cfg["source"] = {
            "path": str(examples / "chat" / "conversations.jsonl"),
            "format": "chat",
            "chat_template": str(examples / "chat" / "template.jinja"),
        }
        cfg["pack"] = {"seq_len": 128, "mode": "best_fit"}
        cfg["split"] = {"val_fraction": 0.1}
        return cfg

    whole, moved = tmp_path / "whole", tmp_path / "moved"
    common = {"max_steps": 8, "save_every": 4}
    moai_train(chat(whole, num_processes=1, micro_batch_size=4, **common), tmp_path)
    moai_train(chat(moved, num_processes=2, micro_batch_size=2, stop_after_steps=4, **common), tmp_path)
    moai_train(chat(moved, num_processes=1, micro_batch_size=1, grad_accum_steps=4, **common), tmp_path)
    a, b = losses(whole), losses(moved)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    diffs = {s: abs(a[s] - b[s]) for s in a}
    print("chat best_fit loss differences per step:", json.dumps(diffs))
    assert max(diffs.values()) < 1e-3, diffs
