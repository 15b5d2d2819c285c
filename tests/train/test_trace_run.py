"""A planted anomaly found from the loss curve: train on CPU, then `moai trace --top-loss --by jump`
names the planted document's file and row."""

import json
import random
import subprocess
import time

import pytest
import yaml

from conftest import PYTHON, subprocess_env, train_bpe, write_jsonl
from learnable import WORDS, config

pytestmark = pytest.mark.slow  # starts `accelerate launch`


def test_a_planted_document_is_the_top_loss_jump(tmp_path):
    docs = [{"text": " ".join(WORDS[(s + i) % len(WORDS)] for i in range(40))} for s in range(300)]
    rng = random.Random(5)
    noise = "".join(rng.choice("qzxjkvwy0123456789!?#%&") for _ in range(1500))  # nothing to learn
    planted = 217  # its line in the file (1-based)
    docs.insert(planted - 1, {"text": noise})
    corpus = write_jsonl(tmp_path / "data" / "corpus.jsonl", docs)
    tok = train_bpe(tmp_path / "tok", [d["text"] for d in docs if d["text"] != noise], vocab_size=300)
    out = tmp_path / "run"
    cfg = config(tmp_path, corpus, tok, out, max_steps=240, save_every=240, micro_batch_size=8, warmup_steps=5)
    f = tmp_path / f"config-{time.monotonic_ns()}.yaml"
    f.write_text(yaml.safe_dump(cfg))
    env, cwd = subprocess_env(), tmp_path
    run = subprocess.run(
        [PYTHON, "-m", "moai.cli", "train", str(f), "--no-progress"], capture_output=True, text=True, env=env, cwd=cwd
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    traced = subprocess.run(
        [PYTHON, "-m", "moai.cli", "trace", str(f), "--top-loss", "1", "--by", "jump", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )
    assert traced.returncode == 0, traced.stderr[-3000:]
    top = json.loads(traced.stdout.strip().splitlines()[-1])[0]
    wheres = {p["where"] for s in top["samples"] for p in s["pieces"]}
    assert f"{corpus}:{planted}" in wheres, (top["step"], top["loss"], top["jump"], sorted(wheres)[:5])
