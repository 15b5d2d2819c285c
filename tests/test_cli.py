import json
import os
import signal
import time

import pytest
import yaml

from conftest import config_dict, moai_cli as moai, moai_started

# Every test here runs the CLI in a subprocess.
pytestmark = pytest.mark.slow


def test_plan_prints_config_and_reasons_and_runs_nothing(tmp_path, corpus):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}})))
    out = moai("plan", str(cfg), cwd=tmp_path, env={"DATASET_BATCH_SIZE": "123"})
    assert out.returncode == 0, out.stderr
    assert '"seq_len": 64' in out.stdout
    assert "batch_size" in out.stdout and "123" in out.stdout and "DATASET_BATCH_SIZE" in out.stdout
    assert "num_proc" in out.stdout and "cores" in out.stdout
    assert not (tmp_path / "cache").exists()


def test_prepare_last_line_is_json_and_errors_are_one_line(tmp_path, corpus):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}})))
    out = moai("prepare", str(cfg), "--no-progress", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    last = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"token_store", "sample_index", "num_tokens", "num_documents"} <= set(last)

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "source": {"path": str(tmp_path / "none*.jsonl")},
                "tokenizer": {"path": "t"},
                "cache_dir": str(tmp_path / "c2"),
            }
        )
    )
    out = moai("prepare", str(bad), cwd=tmp_path)
    assert out.returncode == 2 and "moai: error: source.path" in out.stderr and "matches no files" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.fixture(scope="module")
def tokenizer_corpus(tmp_path_factory):
    """~50 MB of 200k distinct made-up words: training a 30k BPE on it takes ~10 s on 2 cores."""
    import random

    from conftest import write_jsonl

    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 12))) for _ in range(200_000)]
    root = tmp_path_factory.mktemp("bpe")
    corpus = write_jsonl(root / "corpus.jsonl", [{"text": " ".join(rng.choices(words, k=200))} for _ in range(30_000)])
    cfg = root / "train-tokenizer.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "cache_dir": str(root / "cache"),
                "source": {"path": str(corpus)},
                "tokenizer": {"train": {"vocab_size": 30_000}},
                "pack": {"seq_len": 64},
            }
        )
    )
    return cfg, root / "cache"


@pytest.mark.parametrize(
    ("sig", "whole_group"),
    [
        (signal.SIGINT, True),  # Ctrl-C in a terminal: the whole foreground process group gets it
        (signal.SIGTERM, False),  # kill PID, a scheduler's stop
    ],
)
def test_an_interrupt_is_one_line_promptly_even_while_a_tokenizer_trains(tokenizer_corpus, sig, whole_group):
    cfg, cache = tokenizer_corpus
    proc = moai_started("prepare", str(cfg), "--no-progress", cwd=cfg.parent)
    deadline = time.monotonic() + 120
    while not list((cache / "tokenizer").glob(".tmp-*")):  # the Rust trainer is running
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(1.0)
    started = time.monotonic()
    (os.killpg if whole_group else os.kill)(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode == 128 + sig, err
    lines = err.strip().splitlines()
    assert lines[-1] == (
        f"moai: interrupted ({sig.name}); nothing half-written is kept: rerun the same command to continue"
    )
    # the one line: no log record (INFO is for -v), no traceback, no worker noise
    assert len(lines) == 1, err
    assert elapsed < 5, elapsed  # was ~10 s: the rest of the BPE training
    left = [p.name for p in (cache / "tokenizer").iterdir() if not p.name.endswith((".lock", ".jsonl"))]
    assert left == []  # no temporary folder kept, nothing published
    assert out == ""
