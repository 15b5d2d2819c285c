import subprocess

import pytest

from conftest import PYTHON, subprocess_env
from moai.doctor import Facts, evaluate
from moai.hardware import Hardware

GOOD_HW = Hardware(cores=16, mem_available_gb=100.0, disk_type="ssd", disk_free_gb=500.0, gpus=("NVIDIA H100",))
GOOD_TORCH = {"version": "2.13.0", "cuda_devices": ["NVIDIA H100"], "bf16": True, "tf32": True, "flash_sdpa": True}


def facts(**kw) -> Facts:
    base = dict(
        hardware=GOOD_HW,
        plan_summary="8 × 2",
        tokenizer={"kind": "given", "path": "t", "is_fast": True, "vocab_size": 32000},
        torch=GOOD_TORCH,
        prefect_api_url="http://127.0.0.1:4200/api",
        prefect_reachable=True,
    )
    base.update(kw)
    return Facts(**base)


def status(checks, name):
    (c,) = [c for c in checks if c.name == name]
    return c.status


def test_a_good_machine_passes_everything():
    checks = evaluate(facts())
    assert {c.status for c in checks} == {"pass"}, [c for c in checks if c.status != "pass"]


@pytest.mark.parametrize(
    "change, name, expected",
    [
        ({"tokenizer": {"kind": "given", "path": "t", "is_fast": False}}, "tokenizer", "fail"),
        ({"tokenizer": {"kind": "given", "path": "t", "error": "no tokenizer.json"}}, "tokenizer", "fail"),
        ({"tokenizer": {"kind": "train"}}, "tokenizer", "pass"),
        ({"tokenizer": {"kind": "none"}}, "tokenizer", "warn"),
        ({"hardware": Hardware(2, 1.5, "ssd", 500.0)}, "cores and memory", "warn"),
        ({"hardware": Hardware(2, 16, "hdd", 500.0)}, "disk", "warn"),
        ({"hardware": Hardware(2, 16, "network", 500.0)}, "disk", "warn"),
        ({"hardware": Hardware(2, 16, "ssd", 0.5)}, "free space", "fail"),
        ({"hardware": Hardware(2, 16, "ssd", 5.0)}, "free space", "warn"),
        ({"env": {"TOKENIZERS_PARALLELISM": "false"}}, "TOKENIZERS_PARALLELISM", "warn"),
        ({"env": {"RAYON_NUM_THREADS": "2"}}, "RAYON_NUM_THREADS", "warn"),
        ({"env": {"OMP_NUM_THREADS": "1"}}, "OMP_NUM_THREADS", "warn"),
        ({"env": {"FASTOKENS_BPE_THREADS": "2"}}, "FASTOKENS_BPE_THREADS", "warn"),
        ({"env_error": "DATASET_NUM_PROC='x': expected a positive integer"}, "DATASET_* variables", "fail"),
        ({"torch": {}}, "torch", "fail"),
        ({"torch": {"version": "2.13.0", "cuda_devices": []}}, "gpu", "warn"),
        ({"torch": {**GOOD_TORCH, "bf16": False}}, "bf16", "warn"),
        ({"torch": {**GOOD_TORCH, "flash_sdpa": False}}, "flash sdpa", "warn"),
        (
            {"accelerate_default_config": "/root/.cache/huggingface/accelerate/default_config.yaml"},
            "accelerate config",
            "warn",
        ),
        ({"prefect_api_url": None}, "prefect api", "warn"),
        ({"prefect_reachable": False, "prefect_error": "ConnectError"}, "prefect api", "fail"),
        ({"remote_cache": "s3://b/p"}, "remote cache", "pass"),
        ({"remote_cache": "s3://b/p", "remote_error": "cannot read s3://b/p: access denied"}, "remote cache", "fail"),
    ],
)
def test_each_decision(change, name, expected):
    checks = evaluate(facts(**change))
    assert status(checks, name) == expected
    if expected != "pass":
        (c,) = [c for c in checks if c.name == name]
        assert c.fix


@pytest.mark.slow
def test_doctor_on_this_machine_exits_by_its_failures(tmp_path):
    out = subprocess.run(
        [PYTHON, "-m", "moai.cli", "doctor", "tiny"],
        capture_output=True,
        text=True,
        env={**subprocess_env(), "PREFECT_API_URL": "http://127.0.0.1:9/api"},
        cwd=tmp_path,
        timeout=120,
    )
    assert "✘ fail  prefect api" in out.stdout and out.returncode == 1
    assert "pass" in out.stdout and "tokenizer" in out.stdout
    env = {k: v for k, v in subprocess_env().items() if k != "PREFECT_API_URL"}
    out = subprocess.run(
        [PYTHON, "-m", "moai.cli", "doctor", "tiny"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert out.returncode == 0, out.stdout


def test_the_configs_checks_are_rows():
    from moai.preflight import Check

    rows = [
        Check("cache_dir", "fail", "cache_dir /c is not writable", "make it writable"),
        Check("source", "pass", "1 file"),
    ]
    checks = evaluate(facts(preflight=rows))
    assert status(checks, "cache_dir") == "fail" and status(checks, "source") == "pass"


def test_a_missing_tokenizer_folder_fails_in_seconds(tmp_path, monkeypatch, offline_hub):
    """Was ~50 s of hub retries ending in "couldn't connect to huggingface.co"."""
    import time

    from conftest import config_dict, write_jsonl
    from moai.config import parse_config
    from moai.doctor import gather

    monkeypatch.chdir(tmp_path)
    # torch's import (GPU facts) takes seconds of its own on a busy machine: not what is timed here
    monkeypatch.setattr("moai.doctor.accelerator_facts", lambda: {})
    monkeypatch.setattr("moai.hardware._gpus", lambda: ())
    (tmp_path / "tokenizers").mkdir()
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "some words here"}] * 10)
    config = parse_config(config_dict(tmp_path, corpus, {"path": "tokenizers/my-tokenizer"}))
    started = time.monotonic()
    checks = evaluate(gather(config))
    assert time.monotonic() - started < 5.0
    (tok,) = [c for c in checks if c.name == "tokenizer"]
    assert tok.status == "fail" and "tokenizers/my-tokenizer: no such folder" in tok.detail
    assert status(checks, "source") == "pass" and status(checks, "cache_dir") == "pass"
