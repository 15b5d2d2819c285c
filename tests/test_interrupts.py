"""Ctrl-C (SIGINT to the whole process group) and SIGTERM (to the main process) at many moments
of a real `moai prepare` with tokenize worker processes, their start-up included: one line on
stderr, exit 130 / 143, no process of the run left, no lock file or temporary folder left, and a
rerun finishes."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import PYTHON, config_dict, make_texts, moai_started, subprocess_env, write_jsonl


@pytest.fixture(scope="module")
def run_config(tmp_path_factory, tokenizer_dir) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("interrupts")
    data = write_jsonl(root / "data.jsonl", [{"text": t} for t in make_texts(40_000, seed=3)])
    # 2 tokenize processes; a validation split large enough for a sample (no warning line)
    cfg = config_dict(root, data, {"path": str(tokenizer_dir)}, tokenize={"num_proc": 2})
    path = root / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, root / "cache"


def _group(pgid: int) -> list[int]:
    """Every process still alive in the process group `pgid` (the run's session)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


def _tokenize_started(cache: Path) -> bool:
    return (cache / "tokenize").is_dir() and any(p.name.startswith(".tmp-") for p in (cache / "tokenize").iterdir())


# (signal, sent to the whole group like Ctrl-C, when: "start" = seconds after launch, "tokenize" =
# seconds after tokenize's build folder appears, while its workers start and encode)
MOMENTS = [
    (signal.SIGINT, True, "start", 0.5),
    (signal.SIGTERM, False, "start", 1.5),
    (signal.SIGINT, True, "tokenize", 0.0),
    (signal.SIGINT, True, "tokenize", 0.15),
    (signal.SIGTERM, False, "tokenize", 0.3),
    (signal.SIGINT, True, "tokenize", 0.6),
    (signal.SIGTERM, False, "tokenize", 1.0),
]


@pytest.mark.slow
@pytest.mark.parametrize("sig, whole_group, after, delay", MOMENTS)
def test_an_interrupt_at_any_moment_is_one_line_and_leaves_no_process_or_lock(
    run_config, sig, whole_group, after, delay
):
    cfg, cache = run_config
    proc = moai_started("prepare", str(cfg), "--no-progress", cwd=cfg.parent)
    try:
        if after == "tokenize":
            deadline = time.monotonic() + 120
            while not _tokenize_started(cache):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.01)
        time.sleep(delay)
        assert proc.poll() is None, "the run ended before the interrupt: move the moment earlier"
        (os.killpg if whole_group else os.kill)(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
        gone = time.monotonic()
        while _group(proc.pid) and time.monotonic() < gone + 0.5:
            time.sleep(0.02)
        assert _group(proc.pid) == [], "worker processes outlived the run"
    finally:
        if _group(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err
    assert err.splitlines() == [
        f"moai: interrupted ({sig.name}); nothing half-written is kept: rerun the same command to continue"
    ], err
    left = [p for p in cache.rglob(".*") if p.name.endswith(".lock") or p.name.startswith(".tmp-")]
    assert left == [], left


@pytest.mark.slow
def test_a_rerun_after_the_interrupts_finishes(run_config):
    cfg, cache = run_config
    out = subprocess.run(
        [PYTHON, "-m", "moai.cli", "prepare", str(cfg), "--no-progress"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=cfg.parent,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert [p for p in cache.rglob(".*") if p.name.endswith(".lock") or p.name.startswith(".tmp-")] == []


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _never_sees_sigint(pid: int) -> bool:
    """SIGINT blocked (what `moai.workers` does) or ignored in process `pid`."""
    masks = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("SigBlk:", "SigIgn:")):
            masks |= int(line.split()[1], 16)
    return bool(masks & (1 << (signal.SIGINT - 1)))


@pytest.mark.slow
def test_tokenize_workers_leave_ctrl_c_to_the_main_process(run_config, tmp_path):
    """A Ctrl-C reaches every process of the group: the spawned tokenize workers block it from
    their start (so none prints a KeyboardInterrupt traceback while importing), and the main
    process stops them."""
    data = yaml.safe_load(run_config[0].read_text())
    data["cache_dir"] = str(tmp_path / "cache")  # its own: tokenize is built, with its workers
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    proc = moai_started("prepare", str(cfg), "--no-progress", cwd=cfg.parent)
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while len(workers) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            workers = []
            for pid in _children(proc.pid):
                try:
                    if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        workers.append(pid)
                except OSError:
                    continue
            time.sleep(0.01)
        assert all(_never_sees_sigint(pid) for pid in workers)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if _group(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and len(err.splitlines()) == 1, err


SWALLOWED = """
import os, signal, sys, time
from moai import cli

cli._install_handlers()


class Slow:
    def __del__(self):  # the signal arrives while it runs: Python can only print what it raises
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(100_000))


try:
    Slow()
    time.sleep(5)
    print("not interrupted")
except cli.Interrupted as err:
    print("interrupted", err.signum)
"""


@pytest.mark.slow
def test_an_interrupt_raised_inside_a_del_still_stops_the_command_without_a_traceback():
    out = subprocess.run([PYTHON, "-c", SWALLOWED], capture_output=True, text=True, env=subprocess_env(), timeout=60)
    assert out.stdout.strip() == "interrupted 15", out.stdout + out.stderr
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr
