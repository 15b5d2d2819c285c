"""Real `accelerate launch` runs on CPU: learning, exact resume (1 and 2 ranks), 2-rank sharding,
a failing rank (one line on the terminal, the whole output in a log file), resume decided before
data prep and launch, and the final model loading with from_pretrained."""

import json
import math
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import PYTHON, ROOT, TINY_MODEL, moai_started, subprocess_env
from learnable import config, learnable_corpus
from moai.config import parse_config
from moai.launch import Launch, TrainingFailed, launch_command, run_launch

# Every test here starts processes: `accelerate launch` with its ranks, or the CLI that runs it.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    """A corpus where each next word is determined by the last one, and a tokenizer for it."""
    root = tmp_path_factory.mktemp("learnable")
    return root, *learnable_corpus(root)


def moai_train(cfg: dict, where: Path) -> subprocess.CompletedProcess:
    f = where / f"config-{time.monotonic_ns()}.yaml"
    f.write_text(yaml.safe_dump(cfg))
    out = subprocess.run(
        [PYTHON, "-m", "moai.cli", "train", str(f), "--no-progress"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=where,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def losses(output_dir: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in lines if "loss" in r}


def test_a_small_model_learns_and_loads(learnable, tmp_path):
    root, corpus, tok = learnable
    out = tmp_path / "run"
    cfg = config(root, corpus, tok, out, max_steps=60, log_every=10, save_every=30, tracker="tensorboard")
    result = json.loads(moai_train(cfg, tmp_path).stdout.strip().splitlines()[-1])
    from transformers import AutoTokenizer

    vocab_size = len(AutoTokenizer.from_pretrained(tok))
    final_loss = losses(out)[60]
    assert final_loss < 0.5 * math.log(vocab_size), final_loss
    assert result["train"]["eval_ppl"] > 0 and result["train"]["tokens_per_s"] > 0
    line = json.loads((out / "metrics.jsonl").read_text().splitlines()[1])
    assert {"step", "loss", "grad_norm", "lr", "tokens_per_s", "samples_per_s", "mfu"} <= set(line)
    assert line["mfu"] is None  # no GPU peak on CPU
    assert list((out / "moai").rglob("events.out.tfevents.*")), "TensorBoard tracker wrote nothing"
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-00000030", "step-00000060"]

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / "final")
    assert model.config.num_hidden_layers == 2 and AutoTokenizer.from_pretrained(out / "final").eos_token == "<eos>"


@pytest.mark.parametrize("ranks", [1, 2])
def test_resume_gives_bit_identical_losses(learnable, tmp_path, ranks):
    root, corpus, tok = learnable
    whole, split = tmp_path / "whole", tmp_path / "split"
    moai_train(config(root, corpus, tok, whole, num_processes=ranks), tmp_path)
    moai_train(config(root, corpus, tok, split, num_processes=ranks, stop_after_steps=10), tmp_path)
    assert max(losses(split)) == 10 and not (split / "final").exists()
    # What a kill while step 10 was being saved leaves: steps 6-10 logged, the newest checkpoint step 5.
    ckpts = split / "checkpoints"
    (ckpts / "step-00000010").rename(ckpts / ".tmp-step-00000010")
    resumed = moai_train(config(root, corpus, tok, split, num_processes=ranks), tmp_path)
    assert re.search(r"metrics.jsonl: dropped \d+ line\(s\) after step 5", resumed.stdout + resumed.stderr)
    a, b = losses(whole), losses(split)
    assert sorted(a) == sorted(b) == list(range(1, 21))
    assert all(a[s] == b[s] for s in a), {s: (a[s], b[s]) for s in a if a[s] != b[s]}
    records = [json.loads(line) for line in (split / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 21))  # each step once, in order
    starts = [r for r in records if r.get("event") == "start"]
    assert [s["resumed"] for s in starts] == [False, True] and starts[1]["step"] == 5
    assert starts[0]["world_size"] == ranks
    # each launch's split of the global batch, which `moai trace` names a step's ranks by
    assert all(isinstance(s["micro_batch_size"], int) and isinstance(s["grad_accum_steps"], int) for s in starts)


def test_two_cpu_ranks_see_disjoint_samples(learnable, tmp_path):
    root, corpus, tok = learnable
    out = tmp_path / "two"
    moai_train(config(root, corpus, tok, out, num_processes=2, max_steps=4, save_every=4), tmp_path)
    ranks = [json.loads((out / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["first_samples"] and not set(ranks[0]["first_samples"]) & set(ranks[1]["first_samples"])


def test_a_failing_rank_fails_the_launch_fast_with_one_line_and_a_full_log(tmp_path):
    t = parse_config(
        {"source": {"path": "x"}, "tokenizer": {"path": "t"}, "train": {"model_config": TINY_MODEL, "num_processes": 2}}
    ).train
    acc = tmp_path / "accelerate.yaml"
    from moai.launch import BASE_ACCELERATE_CONFIG

    acc.write_text(yaml.safe_dump(BASE_ACCELERATE_CONFIG))
    launch = launch_command(
        t, "unused.json", num_gpus=0, port=_port(), accelerate_config=str(acc), module="failing_rank"
    )
    env = {**launch.env, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "assets"), str(ROOT)])}
    lines = []
    log_file = tmp_path / "logs" / "train.log"
    started = time.monotonic()
    with pytest.raises(TrainingFailed) as err:
        run_launch(Launch(launch.argv, env, launch.num_processes), on_line=lines.append, log_file=log_file)
    assert time.monotonic() - started < 30
    assert str(err.value) == f"training failed: rank 1: ValueError: rank one broke on purpose; full log: {log_file}"
    assert err.value.log_path == str(log_file) and err.value.tail
    log = log_file.read_text()
    assert log.splitlines() == lines  # every line, in order: the tracebacks are there, not in the message
    assert "Traceback (most recent call last)" in log and "ValueError: rank one broke on purpose" in log


def _port() -> int:
    from moai.launch import free_port

    return free_port()


def test_interrupting_the_caller_kills_the_whole_launch(tmp_path):
    """What Prefect's cancellation does to the flow process: the launch's process group goes with it."""
    import signal

    pid_file = tmp_path / "pid"
    # The runner as a flow process is: Ctrl-C neither ignored nor blocked. A shell without job
    # control ignores SIGINT in what it starts in the background (the suite run with `&`), and
    # Python then installs no KeyboardInterrupt handler: the runner would never see the signal.
    code = f"""
import os, signal, yaml
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})
from moai.config import parse_config
from moai.launch import BASE_ACCELERATE_CONFIG, Launch, launch_command, run_launch, free_port
t = parse_config(
    {{"source": {{"path": "x"}}, "tokenizer": {{"path": "t"}}, "train": {{"model_config": {{"model_type": "llama"}}}}}}
).train
open({str(tmp_path / "acc.yaml")!r}, "w").write(yaml.safe_dump(BASE_ACCELERATE_CONFIG))
l = launch_command(
    t,
    {str(pid_file)!r},
    num_gpus=0,
    port=free_port(),
    accelerate_config={str(tmp_path / "acc.yaml")!r},
    module="sleeper",
)
run_launch(Launch(l.argv, {{**l.env, "PYTHONPATH": {str(ROOT / "tests" / "assets")!r}}}, 1), on_line=print)
"""
    runner = subprocess.Popen(
        [PYTHON, "-c", code], env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    os.kill(child, 0)  # alive
    runner.send_signal(signal.SIGINT)
    runner.wait(timeout=30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the training process outlived its cancelled caller")


def moai_cli(cfg: dict, where: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    f = where / f"config-{time.monotonic_ns()}.yaml"
    f.write_text(yaml.safe_dump(cfg))
    return subprocess.run(
        [PYTHON, "-m", "moai.cli", "train", str(f), "--no-progress"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=where,
        timeout=timeout,
    )


def test_resume_is_decided_before_data_prep_and_launch(learnable, tmp_path):
    root, corpus, tok = learnable
    out = tmp_path / "run"
    moai_train(config(root, corpus, tok, out, max_steps=4, save_every=2, stop_after_steps=2), tmp_path)

    # Other settings: one line naming the folder, the setting (old and new) and the fix, before
    # any data is prepared (this config's own cache stays empty) or anything launched.
    changed = config(root, corpus, tok, out, max_steps=4, save_every=2, micro_batch_size=2)
    changed["cache_dir"] = str(tmp_path / "other-cache")
    started = time.monotonic()
    res = moai_cli(changed, tmp_path)
    assert res.returncode == 2 and time.monotonic() - started < 30
    assert res.stderr.strip().splitlines() == [
        f"moai: error: train.output_dir {out} holds checkpoints of a run with other settings: "
        "global batch (samples per optimizer step: train.micro_batch_size x train.grad_accum_steps x ranks, ranks "
        "being train.num_processes x train.num_machines or one per GPU) 4 in the checkpoint, 2 now; an exact resume "
        "needs the same ones: restore them, "
        f"give train.output_dir another folder, or remove this one (rm -rf {out}) to start over"
    ]
    assert not (tmp_path / "other-cache").exists() and len(list((out / "logs").iterdir())) == 1

    moai_train(config(root, corpus, tok, out, max_steps=4, save_every=2), tmp_path)  # resumes, finishes
    assert (out / "final").is_dir() and len(list((out / "logs").iterdir())) == 2

    # Finished: one line, exit 0, no data prep and no launch.
    res = moai_cli(config(root, corpus, tok, out, max_steps=4, save_every=2), tmp_path)
    assert res.returncode == 0, res.stderr
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"moai: already at max_steps 4 in {out}; to train further, continue from its final model")
    assert "launching" not in res.stderr and res.stdout == ""
    assert len(list((out / "logs").iterdir())) == 2


def test_a_failing_training_is_one_line_on_the_terminal(learnable, tmp_path):
    root, corpus, tok = learnable
    out = tmp_path / "bad"
    cfg = config(root, corpus, tok, out, num_processes=2, max_steps=2)
    cfg["train"]["model_config"] = {**TINY_MODEL, "num_key_value_heads": 3}  # fails in the first forward pass
    res = moai_cli(cfg, tmp_path)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    m = re.fullmatch(
        r"moai: error: training failed: rank \d: RuntimeError: (.+?)( \(and 1 more rank\(s\)\))?; full log: (.+)", last
    )
    assert m, last
    log = Path(m.group(3))
    assert log.parent == out / "logs" and re.fullmatch(r"train-\d{8}-\d{6}\.log", log.name)
    assert "Traceback" not in res.stdout + res.stderr and "CalledProcessError" not in res.stdout + res.stderr
    assert all(line.startswith("{") for line in res.stdout.splitlines())  # metrics lines only
    text = log.read_text()
    assert text.count("Traceback (most recent call last)") >= 2 and m.group(1) in text


def test_unpacked_training_then_continued_pretraining(learnable, tmp_path):
    root, corpus, tok = learnable
    first = tmp_path / "unpacked"
    cfg = config(root, corpus, tok, first, max_steps=30, log_every=5, save_every=30)
    cfg["pack"] = {"enabled": False, "seq_len": 32}
    result = json.loads(moai_train(cfg, tmp_path).stdout.strip().splitlines()[-1])
    assert result["sample_index"] is None
    a = losses(first)
    assert a[30] < a[5]

    cont = tmp_path / "continued"
    cfg = config(
        root,
        corpus,
        tok,
        cont,
        mode="continue",
        init_from=str(first / "final"),
        max_steps=5,
        log_every=1,
        save_every=5,
        lr=1e-3,
        warmup_steps=0,
    )
    cfg["train"].pop("model_config")
    cfg["pack"] = {"enabled": False, "seq_len": 32}
    moai_train(cfg, tmp_path)
    b = losses(cont)
    assert b[1] < a[5]  # starts from the trained weights, not from scratch


def test_ctrl_c_during_training_is_one_line_and_leaves_no_rank(learnable, tmp_path):
    import signal

    import psutil

    root, corpus, tok = learnable
    out = tmp_path / "long"
    f = tmp_path / "long.yaml"
    f.write_text(yaml.safe_dump(config(root, corpus, tok, out, num_processes=2, max_steps=100_000, save_every=1000)))
    proc = moai_started("train", str(f), "--no-progress", cwd=tmp_path)
    assert proc.stdout is not None
    for line in proc.stdout:  # training is under way
        if line.startswith('{"step": 2,'):
            break
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - started < 15
    lines = err.strip().splitlines()
    assert lines[-1].startswith("moai: interrupted (SIGINT); nothing half-written is kept")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    resolved = str(out.resolve() / "resolved.json")
    ranks = [p for p in psutil.process_iter(["cmdline"]) if resolved in (p.info["cmdline"] or [])]
    assert ranks == [], ranks


def test_a_run_resumed_on_another_world_size_is_traced_with_each_launchs_ranks(learnable, tmp_path):
    """Steps 1-5 on one process (micro-batch 4), steps 6-8 resumed on two (micro-batch 2, the same
    global batch): `moai trace` names each step's ranks as the launch that trained it read them
    (each launch's ranks/rank-R.json records the samples its ranks read first)."""
    from moai.pipeline import prepare
    from moai.trace import Tracer

    root, corpus, tok = learnable
    out = tmp_path / "run"
    moai_train(config(root, corpus, tok, out, max_steps=8, stop_after_steps=5), tmp_path)
    one = json.loads((out / "ranks" / "rank-0.json").read_text())
    second = config(root, corpus, tok, out, max_steps=8, num_processes=2, micro_batch_size=2)
    moai_train(second, tmp_path)
    two = [json.loads((out / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert one["start_step"] == 0 and [r["start_step"] for r in two] == [5, 5] and two[1]["world_size"] == 2
    cfg = parse_config(second)
    tracer = Tracer(cfg, prepare(cfg, progress=False), preview=False)
    assert [tracer.split_of(s).world for s in (1, 5, 6, 8)] == [1, 1, 2, 2]
    assert [s.index for s in tracer.step(1, rank=0, micro=0)] == one["first_samples"]
    for r in (0, 1):
        assert [s.index for s in tracer.step(6, rank=r, micro=0)] == two[r]["first_samples"]
    assert len(tracer.step(3)) == len(tracer.step(7)) == 4  # the global batch, whichever launch
