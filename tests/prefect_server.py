"""A real `prefect server start` on 127.0.0.1 (free port, temporary home and database, telemetry
off) for the deployment tests, its CLI, and what they read back through its REST API. Every process
started here is stopped by its process group."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from conftest import PYTHON, ROOT, subprocess_env
from moai.launch import free_port

PREFECT = str(Path(PYTHON).parent / "prefect")


def stop(proc: subprocess.Popen, sig=signal.SIGINT, timeout=30) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_healthy(api: str, proc: subprocess.Popen | None, log: Path, timeout_s: float = 120) -> None:
    """Until `api`/health answers; fails with the log's tail when `proc` died or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                return
        alive = proc is None or proc.poll() is None
        assert alive and time.monotonic() < deadline, log.read_text()[-3000:] if log.exists() else "no log"
        time.sleep(0.5)


@contextlib.contextmanager
def started_server(tmp_path: Path) -> Iterator[tuple[dict[str, str], str]]:
    """The server; yields the environment for its CLI (PREFECT_API_URL set) and the API URL."""
    port = free_port()
    env = {
        **subprocess_env(),
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / "prefect-storage"),
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
    }
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_healthy(env["PREFECT_API_URL"], proc, tmp_path / "server.log")
            yield env, env["PREFECT_API_URL"]
        finally:
            stop(proc)


@contextlib.contextmanager
def started_worker(env: dict[str, str], argv: list[str], log: Path, cwd: Path) -> Iterator[subprocess.Popen]:
    """`prefect worker start ...` (argv after `prefect`) until the block ends; stopped like Ctrl-C."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [PREFECT, *argv], env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield proc
        finally:
            stop(proc)


def prefect(env, *args, cwd=ROOT, timeout=300) -> str:
    out = subprocess.run([PREFECT, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"prefect {' '.join(args)}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def run_id_of(output: str) -> str:
    """The flow run id that `prefect deployment run` printed."""
    found = re.search(r"UUID:\s*([0-9a-f-]{36})", output)
    assert found, output[-2000:]
    return found.group(1)


def post(api, path, body) -> list[dict]:
    r = httpx.post(f"{api}{path}", json=body, timeout=30)
    r.raise_for_status()
    return r.json()


def wait_for(api, run_id: str, timeout_s: float = 420) -> str:
    """Wait for the flow run to end; it must have completed."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = httpx.get(f"{api}/flow_runs/{run_id}", timeout=30).json()["state"]
        if state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            break
        assert time.monotonic() < deadline, f"flow run still {state['type']}"
        time.sleep(1)
    assert state["type"] == "COMPLETED", state
    return run_id


def task_states(api, run_id: str) -> dict[str, str]:
    runs = post(api, "/task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})
    return {r["name"].rsplit("-", 1)[0]: r["state"]["name"] for r in runs}


def artifacts_of(api, run_id: str) -> list[dict]:
    return post(api, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}})


def markdown_of(api, run_id: str) -> dict[str, str]:
    """The run's markdown artifacts by key (the overview, the training chart)."""
    return {a["key"]: a["data"] for a in artifacts_of(api, run_id) if a["type"] == "markdown"}
