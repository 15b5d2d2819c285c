"""Two machines, one run, on one host: two `moai train` launches as machines 0 and 1 (CPU, gloo, one
process each, `--num-machines 2 --machine-rank 0|1 --main-process-ip 127.0.0.1`), against one machine
running both ranks. The same losses at every step; machine 1 killed mid-run and machine 0 ending
within 60 s with one line naming it; both rerun resuming exactly, then the run finished on one
machine; an output_dir per machine refused before any training."""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import ROOT, moai_started
from learnable import config, learnable_corpus
from moai.config import ConfigError
from moai.launch import free_port
from moai.train.machines import Topology, is_peer_error, lost_message, machine_text

MAX_STEPS = 40


def test_machines_and_their_ranks_are_named():
    assert machine_text(1, 1) == "machine 1 (rank 1)"
    assert machine_text(1, 4) == "machine 1 (ranks 4-7)"
    top = Topology(rank=0, machine=0, num_machines=3, per_machine=2, local_rank=0, host="h", port=1)
    line = lost_message([2], top, "it stopped answering")
    assert line.startswith("lost machine 2 (ranks 4-5) of 3 machines: it stopped answering")
    assert "this is machine 0 (ranks 0-1)" in line and "same output_dir" in line


def test_only_errors_a_lost_peer_can_cause_are_taken_for_one():
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:4242: Connection reset by peer")
    assert is_peer_error(gloo)
    assert not is_peer_error(ConfigError("train.output_dir x holds checkpoints of a run with other settings"))
    assert not is_peer_error(ValueError("bad value"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A learnable corpus, its tokenizer, the data prepared once, and a one-machine 2-rank reference run."""
    root = tmp_path_factory.mktemp("machines")
    base = config(
        root, *learnable_corpus(root), root / "one-machine", max_steps=MAX_STEPS, save_every=4, num_processes=2
    )
    proc = start(base, root, [])
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return root, base, losses(root / "one-machine")


def start(cfg: dict, where: Path, args: list[str], **train) -> subprocess.Popen:
    """`moai train CONFIG ARGS` in its own process group, `train` merged into the config's train section."""
    f = where / f"config-{time.monotonic_ns()}.yaml"
    f.write_text(yaml.safe_dump({**cfg, "train": {**cfg["train"], **train}}))
    return moai_started("train", str(f), "--no-progress", *args, cwd=where)


def machine(rank: int, port: int) -> list[str]:
    """The options of machine `rank` as docs/multi-node.md's one-host command lines give them, with
    this test's port."""
    for line in (ROOT / "docs" / "multi-node.md").read_text().splitlines():
        if "--main-process-ip 127.0.0.1" in line and f"--machine-rank {rank}" in line:
            args = shlex.split(line.rstrip(" &"))
            assert args[:3] == [".venv/bin/moai", "train", "my.yaml"], line
            return [str(port) if a == "29500" else a for a in args[3:]]
    raise AssertionError(f"docs/multi-node.md has no one-host command line for machine {rank}")


def two_machines(cfg: dict, where: Path, out: Path | tuple[Path, Path], **train) -> list[subprocess.Popen]:
    """Machines 0 and 1 (one process each) of one run; `out`: their output_dir (shared, or one each)."""
    port = free_port()
    dirs = out if isinstance(out, tuple) else (out, out)
    return [start(cfg, where, machine(m, port), output_dir=str(dirs[m]), num_processes=1, **train) for m in (0, 1)]


def finish(procs: list[subprocess.Popen], timeout_s: float = 600) -> list[tuple[int, str]]:
    """Wait for every process; each one's (exit code, stderr)."""
    return [(p.wait(timeout=timeout_s), p.communicate()[1]) for p in procs]


def kill_machine(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to `moai train` and everything it started (accelerate's launcher, torchrun, the
    ranks: accelerate runs in a process group of its own)."""
    for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)


def lose_machine_1(procs: list[subprocess.Popen], out: Path, sig: int) -> tuple[int, str, float]:
    """Once step 6 is logged, send `sig` to machine 1; machine 0's exit code, stderr and seconds to exit."""
    deadline = time.monotonic() + 300
    while logged_step(out) < 6:  # past the checkpoint of step 4
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), finish(procs, 30)
        time.sleep(0.05)
    kill_machine(procs[1], sig)
    lost = time.monotonic()
    try:
        code, err = finish(procs[:1], timeout_s=120)[0]
    finally:
        kill_machine(procs[1])  # a stopped machine is killed for good
        procs[1].wait(timeout=30)
    return code, err, time.monotonic() - lost


def losses(out: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in lines if "loss" in r}


def logged_step(out: Path) -> int:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return 0
    return max((json.loads(s).get("step", 0) for s in path.read_text().splitlines() if s.startswith("{")), default=0)


def same_losses(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want)
    worst = max(abs(got[s] - want[s]) for s in want)
    assert worst <= 1e-6, {s: (got[s], want[s]) for s in want if abs(got[s] - want[s]) > 1e-6}


@pytest.mark.slow
def test_two_machines_train_one_run_lose_one_resume_and_finish_on_one_machine(setup, tmp_path):
    _, base, reference = setup
    out = tmp_path / "shared"

    code, err, took = lose_machine_1(two_machines(base, tmp_path, out), out, signal.SIGKILL)
    print(f"machine 0 exited {took:.1f} s after machine 1 was killed:", err.strip().splitlines()[-1])
    assert code != 0 and took < 60, (code, took)
    lines = err.strip().splitlines()
    assert lines[-1].startswith("moai: error: training failed: rank 0: MachineLost: lost machine 1 (rank 1) of 2"), (
        lines[-5:]
    )
    assert max(losses(out)) < MAX_STEPS and not (out / "final").exists()
    newest = max(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))

    # both machines again: they resume from the newest checkpoint, and stop at step 24
    results = finish(two_machines(base, tmp_path, out, stop_after_steps=24 - newest))
    assert [c for c, _ in results] == [0, 0], [e[-2000:] for _, e in results]
    assert max(losses(out)) == 24

    # the rest on one machine with both ranks (the same global batch: the checkpoint's rule)
    proc = start(base, tmp_path, [], output_dir=str(out))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    same_losses(losses(out), reference)  # every step, through the kill and both resumes
    starts = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines() if '"event": "start"' in s]
    assert [s["world_size"] for s in starts] == [2, 2, 2] and [s["resumed"] for s in starts] == [False, True, True]


@pytest.mark.slow
def test_an_output_dir_per_machine_is_refused_before_any_training(setup, tmp_path):
    _, base, _ = setup
    dirs = (tmp_path / "on-machine-0", tmp_path / "on-machine-1")
    results = finish(two_machines(base, tmp_path, dirs), timeout_s=300)
    for code, err in results:
        last = err.strip().splitlines()[-1]
        assert code != 0 and "must be on storage every machine sees" in last, err[-2000:]
        assert "machine 1 (rank 1) does not see what machine 0 writes there" in last
    for d in dirs:
        assert not (d / "checkpoints").exists() and logged_step(d) == 0


@pytest.mark.slow
def test_a_machine_that_hangs_is_named_within_60_s(setup, tmp_path):
    """Machine 1 stopped (SIGSTOP: its sockets stay open, as when a machine freezes or its network
    goes): the collective on machine 0 would wait for the process group's timeout, 30 minutes; the
    heartbeat names machine 1 after 30 s without a beat."""
    _, base, _ = setup
    out = tmp_path / "shared"
    code, err, took = lose_machine_1(two_machines(base, tmp_path, out), out, signal.SIGSTOP)
    print(f"machine 0 exited {took:.1f} s after machine 1 was stopped:", err.strip().splitlines()[-1])
    assert code != 0 and took < 60, (code, took)
    last = err.strip().splitlines()[-1]
    assert last.startswith("moai: error: training failed: rank 0: MachineLost: lost machine 1 (rank 1) of 2"), last
    assert "no heartbeat for 30 s" in last
