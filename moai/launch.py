"""Starting `accelerate launch python -m moai.train`: what the ranks read, the argument list (pure), the runner.

`resolve` writes what the training processes read: RESOLVED.json, a typed `ResolvedRun` that
each of them validates (see `moai.train.resolved`), and the base accelerate config.

`launch_command` turns the train config and the machine into the exact `accelerate launch`
argument list and environment; it is a pure function, tested with tables. `run_launch` starts it
in a new process session (so the whole group can be killed when the caller is cancelled), writes
every line to a log file and streams it to a callback, keeps the latest metrics line, and on a
non-zero exit raises `TrainingFailed`: one line, the failing rank's reason and where the log is.
The tracebacks (the rank's, then accelerate's, each printed twice) stay in the log file; the CLI
shows only what `is_progress_line` keeps: metrics lines and the ranks' log records.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moai.config import PipelineConfig, TrainConfig
from moai.errors import MoaiError
from moai.train.resolved import DataPaths, ResolvedRun

# `accelerate launch` reads ~/.cache/huggingface/accelerate/default_config.yaml when no config file
# is given; we always pass one, so a user's leftover default cannot change a run.
BASE_ACCELERATE_CONFIG = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "NO",
    "mixed_precision": "no",
    "num_machines": 1,
    "num_processes": 1,
    "machine_rank": 0,
    "use_cpu": False,
}


class TrainingFailed(MoaiError, RuntimeError):
    """`accelerate launch` exited non-zero. The message is one line (the failing rank's reason and
    the log file); `tail` holds the last lines of output and `log_path` the whole output's file."""

    tail: list[str]
    log_path: str | None


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    num_processes: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(
    t: TrainConfig,
    resolved_path: str,
    *,
    num_gpus: int,
    port: int,
    accelerate_config: str,
    python: str = sys.executable,
    module: str = "moai.train",
) -> Launch:
    """The `accelerate launch` argv and extra environment for this train config on this machine."""
    per_machine = t.num_processes or max(1, num_gpus)
    total = per_machine * t.num_machines
    mixed = t.mixed_precision or ("bf16" if num_gpus else "no")
    argv = [
        python,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        t.accelerate_config or accelerate_config,
        "--num_processes",
        str(total),
        "--num_machines",
        str(t.num_machines),
        "--machine_rank",
        str(t.machine_rank),
        "--mixed_precision",
        mixed,
        "--main_process_port",
        str(t.main_process_port or port),
    ]
    env: dict[str, str] = {}
    if num_gpus == 0:
        if total > 1:
            # `--cpu --num_processes N` silently runs one process; this runs N ranks over gloo.
            env["ACCELERATE_USE_CPU"] = "1"
            argv.append("--multi_gpu")
        else:
            argv.append("--cpu")
    elif total > 1:
        argv.append("--multi_gpu")
    if t.main_process_ip:
        argv += ["--main_process_ip", t.main_process_ip]
    if t.compile:
        argv += ["--dynamo_backend", "no"]  # we call torch.compile ourselves
    argv += ["-m", module, "--config", resolved_path]
    return Launch(argv, env, total)


def resolve(config: PipelineConfig, data: DataPaths | dict[str, Any], loader_workers: int) -> Path:
    """Write RESOLVED.json (a `ResolvedRun`: config + data paths) and the base accelerate config
    into the output dir; `data` holds token_store, sample_index and tokenizer, nothing else."""
    assert config.train is not None, "resolve is for a config with a train section"
    out = Path(config.train.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Absolute, so the launched ranks find everything whatever their working directory.
    config = config.model_copy(update={"train": config.train.model_copy(update={"output_dir": str(out)})})
    path = ResolvedRun(config=config, data=DataPaths.model_validate(data), loader_workers=loader_workers).write(
        out / "resolved.json"
    )
    import yaml

    (out / "accelerate.yaml").write_text(yaml.safe_dump(BASE_ACCELERATE_CONFIG))
    return path


FAILED_LINE = re.compile(r"\[rank (\d+)\] moai\.train failed: (.*)")
# A log record of a training process (`moai.train.__main__` formats them so): time, rank, level.
RANK_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \[rank \d+\] (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
# The last line of a traceback: "ValueError: ...", "torch.distributed.DistBackendError: ...".
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Failure)\b:?")


def metrics_record(line: str) -> dict[str, Any] | None:
    """The metrics record a line carries (a step, an eval or an event), else None."""
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if isinstance(record, dict) and ("loss" in record or "eval_loss" in record or record.get("event")):
        return record
    return None


def is_progress_line(line: str) -> bool:
    """Whether a line of the training output is for the terminal: a metrics line or a log record
    of a rank. Tracebacks, library warnings and accelerate's own messages are left to the log file."""
    return metrics_record(line) is not None or RANK_RECORD.match(line) is not None


def last_metrics(lines: Iterable[str]) -> dict[str, Any]:
    """What `run_launch` returns for these output lines: the metrics records merged, newest last."""
    last: dict[str, Any] = {}
    for line in lines:
        if (record := metrics_record(line)) is not None:
            last = {**last, **record}
    return last


def log_path(output_dir: str | Path, machine_rank: int = 0, num_machines: int = 1) -> Path:
    """A new file for the whole output of one launch: `<output_dir>/logs/train-<time>.log`."""
    logs = Path(output_dir) / "logs"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    node = f"-node{machine_rank}" if num_machines > 1 else ""
    path = logs / f"train-{stamp}{node}.log"
    n = 1
    while path.exists():
        n += 1
        path = logs / f"train-{stamp}{node}-{n}.log"
    return path


def failure_reason(failures: list[str], tail: Iterable[str], code: int) -> str:
    """One line for a failed launch: the first failing rank's reason (and how many others failed),
    else the last exception line of the output, else the exit code."""
    if failures:
        more = len(failures) - 1
        return failures[0] + (f" (and {more} more rank(s))" if more else "")
    errors = [line.strip() for line in tail if EXCEPTION_LINE.match(line.strip())]
    errors = [e for e in errors if not e.startswith("subprocess.CalledProcessError")] or errors
    reason = f"accelerate launch exited with code {code}"
    return f"{reason}: {errors[-1][:300]}" if errors else reason


def run_launch(
    launch: Launch,
    on_line: Callable[[str], None],
    on_metrics: Callable[[dict], None] | None = None,
    cwd: str | None = None,
    tail_lines: int = 40,
    log_file: str | Path | None = None,
) -> dict[str, Any]:
    """Run the launch, write every line to `log_file` and hand it to `on_line`; return the last
    metrics line. Raise `TrainingFailed` (one line) on failure."""
    env = {**os.environ, **launch.env, "PYTHONUNBUFFERED": "1"}
    log = None
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        log = open(log_file, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(
        launch.argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    failures: list[str] = []
    last: dict[str, Any] = {}
    assert proc.stdout is not None  # stdout=PIPE
    try:
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            tail.append(line)
            if log is not None:
                log.write(line + "\n")
            on_line(line)
            if m := FAILED_LINE.search(line):
                failures.append(f"rank {m.group(1)}: {m.group(2)}")
            if (record := metrics_record(line)) is not None:
                last = {**last, **record}
                if on_metrics is not None:
                    on_metrics(record)
        code = proc.wait()
    finally:
        if proc.poll() is None:  # cancelled or interrupted: take the whole process group down
            kill_group(proc)
        if log is not None:
            log.close()
    if code != 0:
        where = f"; full log: {log_file}" if log_file is not None else ""
        err = TrainingFailed(f"training failed: {failure_reason(failures, tail, code)}{where}")
        err.tail, err.log_path = list(tail), None if log_file is None else str(log_file)
        raise err
    return last


def kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group `proc` leads (started with start_new_session), SIGKILL it after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
