"""Starting `accelerate launch python -m moai.train`: what the ranks read, the argument list (pure), the runner.

`resolve` writes what the training processes read: RESOLVED.json, a typed `ResolvedRun` that
each of them validates (see `moai.train.resolved`), and the base accelerate config.

`launch_command` turns the train config and the machine into the exact `accelerate launch`
argument list and environment; it is a pure function, tested with tables. `run_launch` starts it
in a new process session (so the whole group can be killed when the caller is cancelled), streams
every line to a callback, keeps the latest metrics line, and on a non-zero exit raises
`TrainingFailed` with the failing rank's message and the last lines of output.
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
from collections.abc import Callable
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
    """`accelerate launch` exited non-zero; the message carries the failing rank's lines."""


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


def run_launch(
    launch: Launch,
    on_line: Callable[[str], None],
    on_metrics: Callable[[dict], None] | None = None,
    cwd: str | None = None,
    tail_lines: int = 40,
) -> dict[str, Any]:
    """Run the launch, stream its output; return the last metrics line. Raise `TrainingFailed` on failure."""
    env = {**os.environ, **launch.env, "PYTHONUNBUFFERED": "1"}
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
            on_line(line)
            if m := FAILED_LINE.search(line):
                failures.append(f"rank {m.group(1)}: {m.group(2)}")
            if line.startswith("{"):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "loss" in record or "eval_loss" in record or record.get("event"):
                    last = {**last, **record}
                    if on_metrics is not None:
                        on_metrics(record)
        code = proc.wait()
    finally:
        if proc.poll() is None:  # cancelled or interrupted: take the whole process group down
            _kill_group(proc)
    if code != 0:
        head = "; ".join(failures[:2]) or f"accelerate launch exited with code {code}"
        raise TrainingFailed(f"training failed: {head}\n--- last lines ---\n" + "\n".join(tail))
    return last


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
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
