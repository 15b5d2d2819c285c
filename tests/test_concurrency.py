"""Racing `moai prepare` processes build each stage once; SIGKILL mid-stage leaves nothing published."""

import json
import os
import signal
import subprocess
import time

import pytest
import yaml

from conftest import PYTHON, config_dict, make_texts, subprocess_env, write_jsonl

# Every test here races `moai prepare` processes.
pytestmark = pytest.mark.slow


def prepare_cmd(cfg_file):
    return [PYTHON, "-m", "moai.cli", "prepare", str(cfg_file), "--no-progress"]


def write_config(tmp_path, data):
    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_four_racing_processes_build_each_stage_once(tmp_path, corpus):
    cfg = write_config(tmp_path, config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}}))
    procs = [
        subprocess.Popen(
            prepare_cmd(cfg),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=subprocess_env(),
            cwd=tmp_path,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert len({(r["token_store"], r["sample_index"]) for r in results}) == 1
    for stage in ("convert", "filter", "save", "tokenizer", "tokenize", "pack"):
        assert sum(r["stages"][stage]["built"] for r in results) == 1, stage
    for stage_dir in (tmp_path / "cache").iterdir():
        visible = [p for p in stage_dir.iterdir() if not p.name.startswith(".")]
        assert len(visible) == 1, visible


def test_sigkill_during_tokenize_leaves_nothing_published(tmp_path, tokenizer_dir):
    corpus = write_jsonl(tmp_path / "big.jsonl", [{"text": t} for t in make_texts(150_000, seed=11)])
    data = config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)})
    data["tokenize"] = {"batch_size": 200}
    cfg = write_config(tmp_path, data)
    tokenize_dir = tmp_path / "cache" / "tokenize"
    proc = subprocess.Popen(
        prepare_cmd(cfg),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
        cwd=tmp_path,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if tokenize_dir.is_dir() and any(p.name.startswith(".tmp-") for p in tokenize_dir.iterdir()):
            break
        time.sleep(0.01)
    assert proc.poll() is None, "prepare ended before tokenize started: " + proc.stderr.read().decode()[-2000:]
    time.sleep(0.3)  # well into the stage, with part files half-written
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    leftovers = [p.name for p in tokenize_dir.iterdir()]
    assert any(n.startswith(".tmp-") for n in leftovers)
    assert not [n for n in leftovers if not n.startswith(".")], f"published after kill: {leftovers}"

    rerun = subprocess.run(
        prepare_cmd(cfg), capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    result = json.loads(rerun.stdout.strip().splitlines()[-1])
    assert result["stages"]["tokenize"]["built"] and not result["stages"]["convert"]["built"]
    assert "left by a builder that died" in rerun.stderr
    assert not [p for p in tokenize_dir.iterdir() if p.name.startswith(".tmp-")]
    assert result["num_documents"] > 100_000
