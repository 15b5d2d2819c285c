"""`prefect deployment run pretrain/default` end to end on a real Prefect server, worker and work pool.

Starts `prefect server start` on 127.0.0.1 (free port, temporary home and database), creates the
process pool, deploys from deployments/prefect.yaml, starts a worker, runs the deployment twice
with tiny parameters, and checks through the REST API: states, task runs (Cached the second
time), artifacts, and the `moai` library's log lines in the run's logs. Every process it starts
is stopped. Telemetry is off; nothing leaves the machine.
"""

import json
import re
import time

import httpx
import pytest
import yaml

from conftest import ROOT
from moai.config import parse_config
from moai.presets import ASSETS, tiny
from prefect_server import (
    artifacts_of,
    markdown_of,
    post,
    prefect,
    run_id_of,
    started_server,
    started_worker,
    task_states,
    wait_for,
)

DATA_STAGES = ["convert", "filter", "save", "tokenizer", "tokenize", "pack"]


def test_shipped_deployment_parameters_are_the_tiny_preset():
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    default, docker = spec["deployments"]
    assert default["name"] == "default" and default["entrypoint"] == "flows/pretrain.py:pretrain"
    assert default["work_pool"]["name"] == "moai"
    shipped = parse_config(default["parameters"]["config"])
    expected = tiny().model_copy(
        update={
            "source": tiny().source.model_copy(update={"path": "moai/assets/tiny.jsonl"}),
            "train": tiny().train.model_copy(update={"output_dir": ".moai/runs/deployed"}),
        }
    )
    assert shipped == expected
    assert (ROOT / shipped.source.path).resolve() == (ASSETS / "tiny.jsonl").resolve()
    # the docker deployment: the same flow and parameters, in the image's /app (tests/test_docker.py runs it)
    assert docker["name"] == "docker" and docker["entrypoint"] == default["entrypoint"]
    assert docker["parameters"] == default["parameters"]
    assert docker["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": "/app"}}]
    variables = docker["work_pool"]["job_variables"]
    assert variables["network_mode"] == "host" and variables["image_pull_policy"] == "Never"
    assert "moai-cache:/app/.moai" in variables["volumes"]
    text = (ROOT / "deployments" / "prefect.yaml").read_text().lower()
    assert not re.search(r"(api_key|password|secret|token:)", text)


@pytest.fixture
def server(tmp_path):
    with started_server(tmp_path) as (env, api):
        yield env, api


def run_and_wait(env, api, params: dict) -> str:
    out = prefect(env, "deployment", "run", "pretrain/default", "--params", json.dumps(params))
    return wait_for(api, run_id_of(out))


@pytest.fixture
def worker(server, tmp_path):
    """The `moai` process pool, the shipped deployment, and a worker; yields the deployment."""
    env, api = server
    prefect(env, "work-pool", "create", "moai", "--type", "process")
    prefect(env, "deploy", "--prefect-file", "deployments/prefect.yaml", "--name", "default")
    argv = ["worker", "start", "--pool", "moai", "--limit", "1"]
    with started_worker(env, argv, tmp_path / "worker.log", cwd=tmp_path) as proc:
        (dep,) = post(api, "/deployments/filter", {})
        yield dep
    assert proc.returncode is not None


@pytest.mark.slow
def test_deployment_run_on_a_real_server(server, worker, tmp_path):
    env, api = server
    config = tiny(cache_dir=str(tmp_path / "cache")).model_dump(mode="json", by_alias=True)
    config["train"].update({"max_steps": 10, "log_every": 2, "save_every": 10})
    first = run_and_wait(env, api, {"config": config})
    states = task_states(api, first)
    assert all(states.get(s) == "Completed" for s in [*DATA_STAGES, "train"]), states

    artifacts = artifacts_of(api, first)
    keys = {a["key"] for a in artifacts if a.get("key")}
    types = {a["type"] for a in artifacts}
    assert {"hardware-plan", "overview", "training", "train-progress", "tokenize-progress"} <= keys, keys
    assert not any(k.endswith("-output") for k in keys)  # paths are text, not file:// links
    assert {"table", "markdown", "progress"} <= types
    markdown = {a["key"]: a["data"] for a in artifacts if a["type"] == "markdown"}
    assert "data:image/svg+xml;base64," in markdown["training"]
    progress = {a["key"]: a["data"] for a in artifacts if a["type"] == "progress"}
    assert progress["train-progress"] == 100.0 and progress["tokenize-progress"] == 100.0

    # the run's last log lines reach the server in the worker's next batch of logs, which may come
    # after the run is Completed (seen once in a CI rehearsal on a loaded machine): wait for them
    deadline = time.monotonic() + 30
    while True:
        logs = post(api, "/logs/filter", {"logs": {"flow_run_id": {"any_": [first]}}, "limit": 200})
        messages = [line["message"] for line in logs]
        if any(m.startswith("step 10 of 10: loss ") for m in messages) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert any(line["name"].startswith("moai") for line in logs), {line["name"] for line in logs}
    assert any(m.startswith("step 10 of 10: loss ") for m in messages), messages[-20:]  # one line per log step
    assert not any(m.startswith("{") or not m.strip() for m in messages)  # no JSON, no blank lines

    second = run_and_wait(env, api, {"config": config})
    states = task_states(api, second)
    assert all(states.get(s) == "Cached" for s in DATA_STAGES), states
    markdown = markdown_of(api, second)
    assert markdown["overview"].startswith("# Data stages: 0 built, 6 reused")
    assert "not launched again" in markdown["training"]


@pytest.mark.slow
def test_run_form_submission_with_a_changed_model(server, worker, tmp_path):
    """What the deployment's run form sends when a user changes train.model_config (seen in Chromium,
    scripts/screenshots.py --only submit): the deployment's parameters with the edited dict, and the
    sections the deployment leaves out filled from the parameter's default, nulls included. The
    server takes it (its schema check is on), and the run trains the changed model."""
    _, api = server
    dep = httpx.get(f"{api}/deployments/{worker['id']}", timeout=30).json()
    assert dep["enforce_parameter_schema"]
    config = json.loads(json.dumps(dep["parameters"]["config"]))
    for key, default in dep["parameter_openapi_schema"]["properties"]["config"]["default"].items():
        config.setdefault(key, default)  # mix, save, tokenize, resources, runner, sources: None
    assert config["tokenize"]["num_proc"] is None and config["sources"] is None
    config["cache_dir"] = str(tmp_path / "cache")
    config["train"].update({"output_dir": str(tmp_path / "run"), "max_steps": 6, "log_every": 2, "save_every": 6})
    config["train"]["model_config"] = {**config["train"]["model_config"], "num_hidden_layers": 3}
    config["train"]["mixed_precision"] = None  # an explicit null: still valid for the server's check
    config["filter"]["max_chars"] = None

    r = httpx.post(
        f"{api}/deployments/{dep['id']}/create_flow_run", json={"parameters": {"config": config}}, timeout=30
    )
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    wait_for(api, run_id)
    sent = httpx.get(f"{api}/flow_runs/{run_id}", timeout=30).json()["parameters"]["config"]
    assert sent["train"]["model_config"]["num_hidden_layers"] == 3
    trained = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert trained["num_hidden_layers"] == 3 and trained["hidden_size"] == 64
