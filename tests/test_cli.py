import json
import subprocess

import pytest
import yaml

from conftest import PYTHON, config_dict, subprocess_env

# Every test here runs the CLI in a subprocess.
pytestmark = pytest.mark.slow


def moai(*args, cwd, env=None):
    return subprocess.run(
        [PYTHON, "-m", "moai.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**subprocess_env(), **(env or {})},
        timeout=300,
    )


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
