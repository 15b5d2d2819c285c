"""The Slurm templates, run with stand-ins for sbatch/srun/scontrol: the commands they submit, and
the array tasks and the merge really run moai on a small config."""

import json
import os
import random
import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import PYTHON, ROOT, config_dict, subprocess_env

SLURM = ROOT / "deployments" / "slurm"
MOAI = str(Path(PYTHON).parent / "moai")
# sbatch options these templates use, as documented by Slurm's sbatch(1).
KNOWN = {
    "--job-name",
    "--array",
    "--cpus-per-task",
    "--mem",
    "--time",
    "--output",
    "--nodes",
    "--ntasks-per-node",
    "--gpus-per-node",
}


def fake_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {
        "sbatch": 'echo "$*" >> "$FAKE_LOG"; n=$(wc -l < "$FAKE_LOG"); echo $((100 + n))',
        "srun": 'echo "srun $*" >> "$FAKE_LOG"; if [ "$1" = "--ntasks-per-node=1" ]; then shift; fi; exec "$@"',
        "scontrol": 'printf "node-a\\nnode-b\\n"',
    }
    for name, body in tools.items():
        f = bin_dir / name
        f.write_text(f"#!/usr/bin/env bash\n{body}\n")
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def env_with(tmp_path, **extra):
    return {
        **subprocess_env(),
        "PATH": f"{fake_bin(tmp_path)}:{os.environ['PATH']}",
        "FAKE_LOG": str(tmp_path / "calls.log"),
        "MOAI": MOAI,
        **extra,
    }


def test_directives_are_documented_options():
    for script in SLURM.glob("*.sbatch"):
        for option in re.findall(r"^#SBATCH\s+(--[a-z-]+)", script.read_text(), re.M):
            assert option in KNOWN, (script.name, option)


@pytest.mark.slow
def test_tokenize_array_then_merge(tmp_path, corpus, tokenizer_dir):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)})))
    env = env_with(tmp_path)
    sub = subprocess.run(
        ["bash", str(SLURM / "tokenize.sbatch"), str(cfg), "3"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert sub.returncode == 0, sub.stderr
    array, merge = (tmp_path / "calls.log").read_text().splitlines()
    assert "--array=0-2" in array and array.endswith(f"{SLURM / 'tokenize.sbatch'} {cfg}")
    assert "--dependency=afterok:101" in merge and f"{MOAI} merge {cfg} --num-shards 3" in merge

    for index in random.Random(1).sample(range(3), 3):  # the array tasks, in any order
        task = subprocess.run(
            ["bash", str(SLURM / "tokenize.sbatch"), str(cfg)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**env, "SLURM_ARRAY_TASK_ID": str(index), "SLURM_ARRAY_TASK_COUNT": "3"},
        )
        assert task.returncode == 0, task.stderr[-2000:]
        assert json.loads(task.stdout.strip().splitlines()[-1])["shard"] == index
    wrapped = re.search(r"--wrap (.*)$", merge).group(1)
    done = subprocess.run(["bash", "-c", wrapped], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["num_tokens"] > 0


@pytest.mark.slow
def test_train_template_passes_each_node_its_rank(tmp_path):
    fake_moai = tmp_path / "moai"
    fake_moai.write_text('#!/usr/bin/env bash\necho "moai $*"\n')
    fake_moai.chmod(0o755)
    env = env_with(tmp_path, MOAI=str(fake_moai), SLURM_JOB_NODELIST="node-[a-b]", SLURM_NNODES="2", SLURM_NODEID="1")
    out = subprocess.run(["bash", str(SLURM / "train.sbatch"), "my.yaml"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "moai",
        "train",
        "my.yaml",
        "--no-progress",
        "--num-machines",
        "2",
        "--machine-rank",
        "1",
        "--main-process-ip",
        "node-a",
        "--main-process-port",
        "29500",
    ]


@pytest.mark.slow
def test_train_cli_overrides_are_validated(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"source": {"path": "x"}, "tokenizer": {"path": "t"}, "train": {"model_config": {"model_type": "llama"}}}
        )
    )
    out = subprocess.run(
        [PYTHON, "-m", "moai.cli", "train", str(cfg), "--num-machines", "2"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=tmp_path,
    )
    assert out.returncode == 2 and "needs train.main_process_ip" in out.stderr
