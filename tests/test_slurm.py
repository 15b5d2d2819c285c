"""The Slurm templates: first with stand-ins for sbatch/srun/scontrol/squeue (the commands they submit,
and the array tasks and the merge really running moai on a small config), then on a real one-node
Slurm (tests/slurm_cluster.py): the array and its merge as docs/slurm.md submits them, a failed shard
recovered with the one documented command, and a few training steps on a node without GPUs."""

import json
import os
import random
import re
import shlex
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import PYTHON, ROOT, TINY_MODEL, config_dict, make_texts, store_files, subprocess_env, write_jsonl
from slurm_cluster import one_node_slurm

SLURM = ROOT / "deployments" / "slurm"
TOKENIZE = SLURM / "tokenize.sbatch"
TRAIN = SLURM / "train.sbatch"
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
        # the reason a job pends (--format=%r), or the array jobs still queued
        "squeue": 'case "$*" in *%r*) echo "${FAKE_REASON:-Priority}" ;; *) printf "%s\\n" ${FAKE_QUEUED:-} ;; esac',
        "scancel": 'echo "scancel $*" >> "$FAKE_LOG"',
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


def bash(*args, env, cwd):
    return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_directives_are_documented_options():
    for script in SLURM.glob("*.sbatch"):
        for option in re.findall(r"^#SBATCH\s+(--[a-z-]+)", script.read_text(), re.M):
            assert option in KNOWN, (script.name, option)


@pytest.mark.slow
def test_tokenize_array_then_merge(tmp_path, corpus, tokenizer_dir):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)})))
    env = env_with(tmp_path)
    sub = bash(TOKENIZE, cfg, 3, "--partition=cpu", "--mem=2G", env=env, cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    assert sub.stdout.split() == ["101", "102"]  # the array's job id, then the merge's
    array, merge = (tmp_path / "calls.log").read_text().splitlines()
    # the user's options go to both sbatch calls, after the defaults they override
    assert array.startswith(
        "--parsable --job-name=moai-tokenize --output=moai-tokenize-%A_%a.out --partition=cpu --mem=2G"
    )
    assert array.endswith(f"--array=0-2 {TOKENIZE} --job task {TOKENIZE} {cfg} 3 --partition=cpu --mem=2G")
    assert merge.startswith("--parsable --job-name=moai-merge --output=moai-merge-%j.out --partition=cpu --mem=2G")
    assert merge.endswith(
        f"--dependency=afterok:101 --kill-on-invalid-dep=yes {TOKENIZE} --job merge {TOKENIZE} {cfg} 3 "
        "--partition=cpu --mem=2G"
    )
    assert "--retry I --partition=cpu --mem=2G" in sub.stderr  # what to run when a shard fails

    job = ["--job", "task", TOKENIZE, cfg, 3, "--partition=cpu", "--mem=2G"]
    for index in random.Random(1).sample(range(3), 3):  # the array tasks, in any order
        # the shard count is the one submitted, not the job's task count (1 for a resubmitted index)
        task = bash(
            TOKENIZE, *job, env={**env, "SLURM_ARRAY_TASK_ID": str(index), "SLURM_ARRAY_TASK_COUNT": "1"}, cwd=tmp_path
        )
        assert task.returncode == 0, task.stderr[-2000:]
        assert json.loads(task.stdout.strip().splitlines()[-1])["shard"] == index
    done = bash(TOKENIZE, "--job", "merge", TOKENIZE, cfg, 3, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["num_tokens"] > 0


@pytest.mark.slow
def test_tokenize_retry_and_its_command(tmp_path):
    env = env_with(tmp_path, FAKE_QUEUED="90 101")
    sub = bash(TOKENIZE, "c.yaml", 8, "--retry", "3,5", "-p", "cpu", env=env, cwd=tmp_path)
    assert sub.returncode == 0, sub.stderr
    array, merge = (tmp_path / "calls.log").read_text().splitlines()
    assert f"--array=3,5 {TOKENIZE} --job task {TOKENIZE} c.yaml 8 -p cpu" in array
    # the new merge waits for the resubmitted shards, and for tasks of the first array still queued
    assert "--dependency=afterok:101,afterany:90 --kill-on-invalid-dep=yes" in merge
    assert f"--job merge {TOKENIZE} c.yaml 8 -p cpu" in merge

    for args, error in [
        (["c.yaml", "--retry", "2"], "--retry needs N"),
        (["c.yaml", 4, "--retry", "4"], "shard 4 is out of range for N=4"),
        (["c.yaml", 4, "--retry"], "--retry takes shard indices"),
        (["c.yaml", 4, "2", "-p", "cpu"], "'2' is not an sbatch option"),
    ]:
        out = bash(TOKENIZE, *args, env=env, cwd=tmp_path)
        assert out.returncode == 2 and error in out.stderr, (args, out.stderr)

    # a failed shard's log ends with the command that reruns it and the merge
    failing = tmp_path / "failing-moai"
    failing.write_text("#!/usr/bin/env bash\necho 'moai: error: disk full' >&2\nexit 2\n")
    failing.chmod(0o755)
    env = {**env, "MOAI": str(failing), "SLURM_ARRAY_TASK_ID": "6"}
    task = bash(TOKENIZE, "--job", "task", TOKENIZE, "my config.yaml", 8, "-p", "cpu", env=env, cwd=tmp_path)
    assert task.returncode == 2
    assert task.stderr.splitlines()[-1] == f"bash {TOKENIZE} my\\ config.yaml 8 --retry 6 -p cpu"


@pytest.mark.slow
@pytest.mark.parametrize("template", [TOKENIZE, TRAIN])
def test_a_job_that_can_never_start_is_cancelled(tmp_path, template):
    out = bash(template, "c.yaml", env=env_with(tmp_path, FAKE_REASON="PartitionConfig"), cwd=tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    assert "moai: error: Slurm will never start job 101 as asked (Reason=PartitionConfig" in out.stderr
    assert (tmp_path / "calls.log").read_text().splitlines()[-1] == "scancel 101"  # and no merge submitted


@pytest.mark.slow
def test_train_template_passes_each_node_its_rank(tmp_path):
    fake_moai = tmp_path / "moai"
    fake_moai.write_text('#!/usr/bin/env bash\necho "moai $*"\n')
    fake_moai.chmod(0o755)
    env = env_with(
        tmp_path,
        MOAI=str(fake_moai),
        SLURM_JOB_ID="7",
        SLURM_JOB_NODELIST="node-[a-b]",
        SLURM_NNODES="2",
        SLURM_NODEID="1",
        SLURM_CPUS_PER_TASK="16",
    )
    out = bash(TRAIN, "my.yaml", env=env, cwd=tmp_path)
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
def test_train_template_submits_itself(tmp_path):
    env = env_with(tmp_path)
    out = bash(TRAIN, "my.yaml", "--partition=gpu", "--nodes=4", env=env, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.split() == ["101"], out.stderr
    assert (tmp_path / "calls.log").read_text().splitlines() == [
        f"--parsable --nodes=2 --cpus-per-task=64 --gpus-per-node=8 --partition=gpu --nodes=4 {TRAIN} my.yaml"
    ]
    (tmp_path / "calls.log").unlink()
    out = bash(TRAIN, "my.yaml", "--nodes=1", env={**env, "GPUS_PER_NODE": "0"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # no GPU request at all: a cluster without GPUs refuses any gres
    assert (tmp_path / "calls.log").read_text().splitlines() == [
        f"--parsable --nodes=2 --cpus-per-task=2 --nodes=1 {TRAIN} my.yaml"
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


# --- a real one-node Slurm ------------------------------------------------------------------------------------


def readme_commands(cfg: Path) -> dict[str, tuple[dict[str, str], list[str]]]:
    """The commands of docs/slurm.md (`submit`, `retry`, `train`), each as its environment
    assignments and its words, for `cfg` in place of my.yaml and with the templates' absolute paths."""
    section = (ROOT / "docs" / "slurm.md").read_text()
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = {}
    for line in block.splitlines():
        if line.startswith("#"):
            continue
        words = [
            str(cfg) if w == "my.yaml" else str(ROOT / w) if w.startswith("deployments/") else w
            for w in shlex.split(line)
        ]
        env = dict(w.split("=", 1) for w in words[: words.index("bash")])
        words = words[words.index("bash") :]
        name = "train" if words[1] == str(TRAIN) else "retry" if "--retry" in words else "submit"
        commands[name] = env, words
    assert set(commands) == {"submit", "retry", "train"}, block
    return commands


@pytest.fixture(scope="module")
def slurm():
    with one_node_slurm() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, tokenizer_dir):
    """A corpus of several 1 MiB tokenize parts (every one of 4 shards builds some), and the files of
    its token store as a local `moai prepare` publishes them."""
    root = tmp_path_factory.mktemp("slurm-data")
    corpus = write_jsonl(root / "c.jsonl", [{"text": t} for t in make_texts(12_000, seed=5) * 3])
    data = config_dict(root, corpus, {"path": str(tokenizer_dir)})
    local = dict(data, cache_dir=str(root / "local"))
    (root / "local.yaml").write_text(yaml.safe_dump(local))
    out = subprocess.run(
        [MOAI, "prepare", str(root / "local.yaml"), "--no-progress"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=root,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return data, store_files(root / "local" / "tokenize")


def slurm_env(slurm, **extra):
    return {**subprocess_env(), **slurm.env, "MOAI": MOAI, **extra}


def submitted(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def job_logs(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text(errors="replace") for p in sorted(folder.glob("moai-*.out"))}


@pytest.mark.slow
def test_real_slurm_refuses_what_no_node_has(slurm, tmp_path):
    """More CPUs than the node has, or 2 nodes (train's default) of a one-node cluster: Slurm accepts
    such a job and leaves it pending for good (PartitionConfig here); the templates cancel it at once and
    say why."""
    env = slurm_env(slurm)
    cpus = f"--cpus-per-task={8 * (os.cpu_count() or 1)}"
    for template, args, extra in [(TOKENIZE, ["c.yaml", "4", cpus], {}), (TRAIN, ["t.yaml"], {"GPUS_PER_NODE": "0"})]:
        out = bash(template, *args, env={**env, **extra}, cwd=tmp_path)
        assert out.returncode == 1 and "as asked (Reason=Partition" in out.stderr, out.stderr
    assert slurm.run("squeue", "--noheader") == ""  # nothing left pending


@pytest.mark.slow
def test_real_slurm_tokenize_array_then_merge(slurm, sharded, tmp_path):
    data, local = sharded
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(dict(data, cache_dir=str(tmp_path / "cache"))))
    env = slurm_env(slurm)
    # docs/slurm.md's command (4 shards; 1 CPU a task, so two run at once on 2 CPUs).
    _, command = readme_commands(cfg)["submit"]
    array, merge = submitted(subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path))
    jobs = slurm.wait(array, merge)
    assert {k: r["JobState"] for k, r in jobs.items()} == {
        **{f"{array}_{i}": "COMPLETED" for i in range(4)},
        merge: "COMPLETED",
    }
    assert all(jobs[f"{array}_{i}"]["NumCPUs"] == "1" for i in range(4))  # the options reached sbatch

    logs = job_logs(tmp_path)
    for i in range(4):
        shard = json.loads(logs[f"moai-tokenize-{array}_{i}.out"].strip().splitlines()[-1])
        assert shard["shard"] == i and shard["num_shards"] == 4 and shard["built"] >= 1, shard
    assert not [name for name, text in logs.items() if "\r" in text]  # no progress bars in the job logs
    files = store_files(tmp_path / "cache" / "tokenize")
    assert files.keys() == local.keys() and all(files[k] == local[k] for k in local)


@pytest.mark.slow
def test_real_slurm_failed_shard_is_recovered_with_one_command(slurm, sharded, tmp_path):
    data, local = sharded
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(dict(data, cache_dir=str(tmp_path / "cache"))))
    broken = tmp_path / "broken"  # shard 2 fails while this file exists
    broken.touch()
    flaky = tmp_path / "moai"
    flaky.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = tokenize-shard ] && [ "$SLURM_ARRAY_TASK_ID" = 2 ] && [ -e {broken} ]; then\n'
        "  echo 'moai: error: injected failure' >&2; exit 2\nfi\n"
        f'exec {MOAI} "$@"\n'
    )
    flaky.chmod(0o755)
    env = slurm_env(slurm, MOAI=str(flaky))
    commands = readme_commands(cfg)
    _, command = commands["submit"]
    array, merge = submitted(subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path))

    deadline = time.monotonic() + 120
    while not any(r.get("ArrayTaskId") == "2" and r["JobState"] == "FAILED" for r in slurm.jobs(array)):
        assert time.monotonic() < deadline, slurm.jobs(array)
        time.sleep(0.3)
    log = (tmp_path / f"moai-tokenize-{array}_2.out").read_text()
    command = shlex.split(log.strip().splitlines()[-1])
    assert command == commands["retry"][1], log  # docs/slurm.md's recovery command
    broken.unlink()  # the cause is fixed
    # at once, with other tasks of the array perhaps still queued or running
    retry, new_merge = submitted(subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path))

    jobs = slurm.wait(array, merge, retry, new_merge)
    states = {k: r["JobState"] for k, r in jobs.items()}
    assert states == {
        **{f"{array}_{i}": "FAILED" if i == 2 else "COMPLETED" for i in range(4)},
        merge: "CANCELLED",
        f"{retry}_2": "COMPLETED",
        new_merge: "COMPLETED",
    }, states
    assert jobs[merge]["Reason"] == "DependencyNeverSatisfied"
    # the new merge started only once every task of the first array had ended
    assert jobs[new_merge]["StartTime"] >= max(jobs[f"{array}_{i}"]["EndTime"] for i in range(4))
    files = store_files(tmp_path / "cache" / "tokenize")
    assert files.keys() == local.keys() and all(files[k] == local[k] for k in local)


@pytest.mark.slow
def test_real_slurm_train_on_a_node_without_gpus(slurm, tmp_path, corpus, tokenizer_dir):
    out_dir = tmp_path / "run"
    train = {"model_config": TINY_MODEL, "output_dir": str(out_dir), "max_steps": 4, "micro_batch_size": 4}
    train |= {"log_every": 1, "save_every": 4, "eval_batches": 2, "tracker": "none"}
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}, train=train)))
    # docs/slurm.md's command for one node without GPUs.
    extra, command = readme_commands(cfg)["train"]
    assert extra == {"GPUS_PER_NODE": "0"}
    (job,) = submitted(
        subprocess.run(command, capture_output=True, text=True, env=slurm_env(slurm, **extra), cwd=tmp_path)
    )
    record = slurm.wait(job, timeout=300)[job]
    log = (tmp_path / f"moai-train-{job}.out").read_text(errors="replace")
    assert record["JobState"] == "COMPLETED", log[-3000:]
    assert record["NumNodes"] == "1" and record["NumCPUs"] == "2" and "gres" not in record.get("TresPerNode", "")
    steps = [json.loads(line) for line in log.splitlines() if line.startswith('{"step"')]
    assert [s["step"] for s in steps if "loss" in s] == [1, 2, 3, 4]
    assert (out_dir / "final" / "config.json").is_file()
    assert "\r" not in log  # the data stages were built in this job, with no progress bars
