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
