"""The trackers for real: an MLflow tracking server on loopback (sqlite store, artifacts proxied to
a temp folder) and the wandb library offline, each fed by real `accelerate launch` runs over a
mixed index (so tokens per source and eval loss per source are among the metrics). Every number a
tracker holds must equal `metrics.jsonl` at the same step, once, including across a kill -9 and
the resume after it."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, TINY_MODEL, subprocess_env
from learnable import config, learnable_corpus
from mixed_sources import SEQ, launch_for, three_source_mix
from moai.launch import free_port, kill_group, run_launch
from moai.train.metrics import MetricsWriter
from moai.train.tracking import Tracker, flat_params, tracker_numbers

# -- quick: what a tracker gets ----------------------------------------------------------------------


def test_tracker_numbers_flatten_sources_and_skip_events_and_nulls():
    record = {"step": 4, "loss": 1.5, "mfu": None, "lr": 1e-3, "tokens_by_source": {"ko": 20, "en": 10}}
    assert tracker_numbers(record) == {"loss": 1.5, "lr": 1e-3, "tokens/ko": 20, "tokens/en": 10}
    assert tracker_numbers({"event": "start", "step": 0, "world_size": 2}) == {}
    assert tracker_numbers({"step": 3, "eval_loss": 2.0, "eval_loss/ko": 1.9}) == {
        "eval_loss": 2.0,
        "eval_loss/ko": 1.9,
    }


def test_flat_params_are_dotted_keys_with_json_for_the_rest():
    tree = {"train": {"lr": 0.001, "model_config": {"hidden_size": 64}, "num_processes": None}, "x": [1, 2]}
    assert flat_params(tree) == {
        "train.lr": 0.001,
        "train.model_config.hidden_size": 64,
        "train.num_processes": "null",
        "x": "[1, 2]",
    }


class _Main:
    is_main_process = True


class _Recorder(Tracker):
    """A tracker that keeps what it is given."""

    def __init__(self):
        self.logged = []

    def log(self, numbers, step):
        self.logged.append((step, numbers))


def test_the_tracker_gets_tokens_and_eval_loss_per_source_at_the_checkpoint(tmp_path, capsys):
    tracker = _Recorder()
    writer = MetricsWriter(_Main(), tmp_path, tracker=tracker)
    writer.write({"step": 2, "loss": 1.5, "tokens": 30, "tokens_by_source": {"ko": 20, "en": 10}})
    writer.write({"step": 2, "eval_loss": 1.2, "eval_loss/ko": 1.1, "eval_loss/en": 1.4})
    assert tracker.logged == []  # not before the checkpoint of step 2
    writer.commit(2)
    writer.close()
    assert tracker.logged == [
        (2, {"loss": 1.5, "tokens": 30, "tokens/ko": 20, "tokens/en": 10}),
        (2, {"eval_loss": 1.2, "eval_loss/ko": 1.1, "eval_loss/en": 1.4}),
    ]
    assert json.loads((tmp_path / "tracker.json").read_text())["logged_through"] == 2
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["tokens_by_source"] == {"ko": 20, "en": 10}
    assert capsys.readouterr().out.count("\n") == 2


def test_a_resumed_writer_gives_the_tracker_what_it_missed_up_to_the_checkpoint(tmp_path):
    """Killed between the checkpoint of step 4 and its commit (tracker at step 2), then after step 5:
    the resumed run (from step 4) first gives the tracker steps 3-4 from metrics.jsonl, never 5."""
    lines = [{"event": "start", "step": 0}] + [{"step": s, "loss": 1.0 / s} for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    tracker = _Recorder()
    writer = MetricsWriter(_Main(), tmp_path, start_step=4, tracker=tracker, logged_through=2)
    assert tracker.logged == [(3, {"loss": 1 / 3}), (4, {"loss": 0.25})]
    writer.write({"step": 5, "loss": 0.5})
    writer.commit(5)
    writer.close()
    assert tracker.logged[-1] == (5, {"loss": 0.5})
    assert [json.loads(s)["step"] for s in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4, 5]


# -- slow: real runs, a real server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    tok, stores, (index,) = three_source_mix(tmp_path_factory.mktemp("trackmix"))
    return tok, stores, index


def metrics_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def expected_history(out: Path) -> dict[str, dict[int, float]]:
    """key -> {step: value}: what every tracker must hold, read from metrics.jsonl."""
    history: dict[str, dict[int, float]] = {}
    for record in metrics_lines(out):
        for key, v in tracker_numbers(record).items():
            assert record["step"] not in history.get(key, {}), f"metrics.jsonl has {key} twice at {record['step']}"
            history.setdefault(key, {})[record["step"]] = v
    return history


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


DOC = ROOT / "docs" / "tracking.md"


def doc_commands() -> list[str]:
    """The command lines of docs/tracking.md's bash blocks, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def doc_command(starts: str, ports: dict[str, int]) -> str:
    """The docs' command line that starts with `starts`, with `ports` put in place of the docs' ones."""
    line = next(c for c in doc_commands() if c.startswith(starts))
    for theirs, ours in ports.items():
        line = line.replace(theirs, str(ours))
    return line


def with_venv(where: Path) -> Path:
    """`where`, with .venv linked to the repository's, so the docs' `.venv/bin/...` runs as written."""
    where.mkdir(parents=True, exist_ok=True)
    (where / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return where


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """The docs' `mlflow server` command (sqlite store, artifacts in a folder, on 127.0.0.1) with a free
    port, in a temp folder; stopped by pid."""
    root = with_venv(tmp_path_factory.mktemp("mlflow"))
    port = free_port()
    argv = shlex.split(doc_command(".venv/bin/mlflow server", {"5000": port}).rstrip(" &"))
    log = open(root / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(argv, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, 120, "the MLflow server", interval_s=0.5)
        yield url, port
    finally:
        kill_group(proc, grace_s=5)
        log.close()


@pytest.mark.slow
def test_mlflow_run_equals_metrics_jsonl_across_a_kill_and_resume(mix, tmp_path, mlflow_server, monkeypatch):
    from mlflow.tracking import MlflowClient

    url, _ = mlflow_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    out = tmp_path / "run-mlflow"
    launch = launch_for(*mix, out, max_steps=40, save_every=10, eval_every=10, tracker="mlflow", tracker_project="t1")
    env = {**os.environ, **launch.env, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        launch.argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:

        def past_step_12() -> bool:
            path = out / "metrics.jsonl"
            return path.is_file() and any(json.loads(s).get("step", 0) >= 12 for s in path.read_text().splitlines())

        wait_for(past_step_12, 300, "step 12 in metrics.jsonl")
        os.killpg(proc.pid, signal.SIGKILL)  # the whole launch at once, as a lost machine or OOM killer would
        proc.wait(timeout=30)
    finally:
        kill_group(proc, grace_s=5)
    killed_at = max(r["step"] for r in metrics_lines(out) if "loss" in r)
    assert 12 <= killed_at < 40 and not (out / "final").exists(), killed_at
    state = json.loads((out / "tracker.json").read_text())
    client = MlflowClient(url)
    run_id = state["run_id"]
    logged = {m.step for m in client.get_metric_history(run_id, "loss")}
    assert logged == set(range(1, state["logged_through"] + 1)), "the tracker got steps past their checkpoint"

    records: list[dict] = []
    run_launch(
        launch_for(*mix, out, max_steps=40, save_every=10, eval_every=10, tracker="mlflow", tracker_project="t1"),
        on_line=lambda line: None,
        on_metrics=records.append,
    )
    start = next(r for r in records if r.get("event") == "start")
    assert start["resumed"] and start["step"] == 10 * (killed_at // 10)
    assert json.loads((out / "tracker.json").read_text())["run_id"] == run_id  # the same MLflow run

    expected = expected_history(out)
    assert {
        "loss",
        "eval_loss",
        "eval_loss/ko",
        "eval_loss/code",
        "eval_loss/en",
        "tokens_per_s",
        "lr",
        "grad_norm",
        "tokens/ko",
        "tokens/code",
        "tokens/en",
    } <= set(expected)
    for key, steps in expected.items():
        history = client.get_metric_history(run_id, key)
        assert sorted(m.step for m in history) == sorted(steps), f"{key}: steps missing or duplicated"
        assert {m.step: m.value for m in history} == pytest.approx(steps, rel=1e-12), key
    runs = client.search_runs([client.get_experiment_by_name("t1").experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.max_steps"] == "40" and run.data.params["pack.seq_len"] == str(SEQ)
    assert run.data.params["train.model_config.hidden_size"] == str(TINY_MODEL["hidden_size"])
    files = {Path(a.path).name for a in client.list_artifacts(run_id, "final")}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files, files
    assert start["tracker_url"] == f"{url}/#/experiments/{run.info.experiment_id}/runs/{run_id}"


def wandb_records(path: Path):
    """The records of a W&B run file (`run-<id>.wandb`): a LevelDB-style log of 32 KiB blocks, each
    record a 7-byte header (masked CRC-32, length, type: full/first/middle/last) and a protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1), "not a W&B run file"
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # the padded end of a block
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            yield record


@pytest.mark.slow
def test_wandb_offline_run_files_equal_metrics_jsonl_across_a_resume(mix, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run-wandb"
    run_launch(launch_for(*mix, out, tracker="wandb", stop_after_steps=10), on_line=lambda line: None)
    run_launch(launch_for(*mix, out, tracker="wandb"), on_line=lambda line: None)

    run_id = json.loads((out / "tracker.json").read_text())["run_id"]
    folders = sorted((out / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(folders) == 2  # one per invocation, the same run id: `wandb sync` puts both into one run
    history: dict[str, dict[int, float]] = {}
    config = {}
    for folder in folders:
        for record in wandb_records(folder / f"run-{run_id}.wandb"):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                step = items.pop("_step")
                for key, v in items.items():
                    if not key.startswith("_"):
                        assert step not in history.get(key, {}), f"{key} twice at step {step}"
                        history.setdefault(key, {})[step] = v
            elif kind == "run":
                config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
    expected = expected_history(out)
    assert set(history) == set(expected)
    for key, steps in expected.items():
        assert history[key] == pytest.approx(steps, rel=1e-12), key
    assert {"eval_loss/ko", "tokens/en", "loss"} <= set(history)
    assert config["train.max_steps"] == 24 and config["train.tracker"] == "wandb"


@pytest.mark.slow
def test_the_docs_commands_run_as_written(mlflow_server, tmp_path):
    """docs/tracking.md's commands, in folders with my.yaml and .venv: moai train into MLflow (the
    server is the docs' command, `mlflow_server`), into W&B offline, into TensorBoard, then the
    docs' tensorboard command serving the run's loss."""
    from mlflow.tracking import MlflowClient

    url, port = mlflow_server
    corpus, tok = learnable_corpus(tmp_path / "data")

    def run_doc(starts: str, tracker: str, ports: dict[str, int]) -> Path:
        where = with_venv(tmp_path / tracker)
        cfg = config(tmp_path, corpus, tok, Path("runs/my-run"), max_steps=6, save_every=3, tracker=tracker)
        (where / "my.yaml").write_text(yaml.safe_dump(cfg))
        line = doc_command(starts, ports)
        out = subprocess.run(["bash", "-c", line], cwd=where, env=subprocess_env(), capture_output=True, text=True)
        assert out.returncode == 0, (line, out.stderr[-3000:])
        return where / "runs" / "my-run"

    wait = doc_command("until curl", {"5000": port})
    assert subprocess.run(["bash", "-c", f"timeout 60 bash -c '{wait}'"]).returncode == 0
    out = run_doc("MLFLOW_TRACKING_URI=", "mlflow", {"5000": port})
    client = MlflowClient(url)
    run_id = json.loads((out / "tracker.json").read_text())["run_id"]
    assert client.get_run(run_id).info.run_name == "my-run"
    history = {m.step: m.value for m in client.get_metric_history(run_id, "loss")}
    assert history == pytest.approx(expected_history(out)["loss"], rel=1e-12) and len(history) == 6

    out = run_doc("WANDB_MODE=offline", "wandb", {})
    sync = doc_command(".venv/bin/wandb sync", {})
    assert sync.split()[-1] == "runs/my-run/wandb/offline-run-*"
    assert len(list(out.parent.parent.glob(sync.split()[-1]))) == 1  # what `wandb sync` would upload

    tb_port = free_port()
    tb_dir = run_doc(".venv/bin/moai train my.yaml", "tensorboard", {}).parent.parent  # the default tracker
    argv = shlex.split(doc_command(".venv/bin/tensorboard", {"6006": tb_port}))
    proc = subprocess.Popen(
        argv, cwd=tb_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        tags: dict = {}

        def serves_loss() -> bool:
            assert proc.poll() is None, "tensorboard exited"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{tb_port}/data/plugin/scalars/tags", timeout=2) as r:
                    tags.update(json.loads(r.read()))
            except OSError:
                return False
            return any("loss" in run_tags for run_tags in tags.values())

        wait_for(serves_loss, 120, "tensorboard serving the run's loss", interval_s=1)
    finally:
        kill_group(proc, grace_s=5)
