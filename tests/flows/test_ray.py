"""The flow with `runner: {kind: ray}` maps the dedup signature units and the tokenize units on
real Ray (a local Ray the flow starts on loopback, or an existing cluster found by `auto`;
2 CPUs) and publishes signatures and a token store byte-identical to a local run;
without Ray installed, preflight names the extra to install."""

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT, assert_units_match_local, config_dict, subprocess_env, units_baseline
from moai import preflight
from moai.config import ConfigError, parse_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ray_cluster(num_cpus: int):
    """`ray start --head --block` on loopback, as a cluster someone else runs: its GCS address
    (host:port). Stopped by its own process (`ray stop` would stop every Ray on the machine)."""
    port = _free_port()
    folder = tempfile.mkdtemp(prefix="moai-ray-")  # short: Ray's socket paths have a length limit
    env = {**subprocess_env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    # token authentication off on this loopback test cluster; a real one asks the flow's environment
    # for RAY_AUTH_MODE=token and its token (README, Scaling out)
    env["RAY_AUTH_MODE"] = "disabled"
    cmd = [str(Path(PYTHON).parent / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1"]
    cmd += [f"--port={port}", f"--num-cpus={num_cpus}", "--include-dashboard=false", "--disable-usage-stats"]
    cmd += [f"--ray-client-server-port={_free_port()}", f"--temp-dir={folder}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(Path(folder).glob("session_*/logs/raylet.out")) or not _listens(port):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()  # `ray start --block` stops the processes it started
        proc.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def _listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow  # a Prefect test server and Ray (worker processes)
@pytest.mark.parametrize("where", ["local-ray", "auto"])
def test_ray_gives_the_local_store(prefect_server, pretrain, tmp_path, tokenizer_dir, monkeypatch, where):
    base, local = units_baseline(tmp_path, tokenizer_dir)

    with contextlib.ExitStack() as stack:
        runner = {"kind": "ray", "n_workers": 2, "num_shards": 4}
        if where == "auto":  # an existing cluster: `auto` finds it by RAY_ADDRESS, as on a cluster's node
            from flows.pretrain import ray_on_loopback

            monkeypatch.setenv("RAY_ADDRESS", stack.enter_context(ray_cluster(2)))
            # this machine is the cluster's node, and that node is on loopback: without this, Ray
            # turns 127.0.0.1 into the machine's outward address, where the cluster does not listen
            stack.enter_context(ray_on_loopback())
            runner = {"kind": "ray", "address": "auto", "num_shards": 4}
        cfg = parse_config({**base, "cache_dir": str(tmp_path / "ray"), "runner": runner})
        state = pretrain(cfg, return_state=True)
        assert state.is_completed(), state
    assert_units_match_local(tmp_path, "ray", local, state.result())


@pytest.mark.slow  # starts a local Ray
def test_the_local_ray_listens_on_loopback_only(pretrain, tmp_path):
    import psutil
    import ray

    from flows.pretrain import unit_runner
    from moai.hardware import detect, plan as make_plan

    cfg = parse_config({**config_dict(tmp_path, "x.jsonl", {"path": "t"}), "runner": {"kind": "ray", "n_workers": 2}})
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with unit_runner(cfg, make_plan(detect(cfg.cache_dir), cfg)) as runner, runner:
        assert [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]] == ["127.0.0.1"]
        assert ray.cluster_resources()["CPU"] == 2
        started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        assert {"gcs_server", "raylet"} <= {p.name() for p in started}
        listening = {
            (p.name(), c.laddr.ip, c.laddr.port)
            for p in started
            for c in p.net_connections("inet")
            if c.status == psutil.CONN_LISTEN
        }
        assert listening and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for _, ip, _ in listening), listening
    assert not ray.is_initialized()  # shut down after the units


def test_ray_not_installed_is_one_line_before_any_stage(tmp_path, corpus, monkeypatch):
    monkeypatch.setattr(preflight, "_installed", lambda module: module != "prefect_ray")
    cfg = parse_config({**config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}}), "runner": {"kind": "ray"}})
    with pytest.raises(ConfigError) as err:
        preflight.require(cfg)
    assert str(err.value) == (
        "runner.kind ray needs prefect-ray, not installed here: pip install 'moai[ray]' (or runner.kind local)"
    )
    assert not (tmp_path / "cache").exists()  # no stage ran


def test_a_dask_address_for_ray_is_refused(tmp_path):
    data = config_dict(tmp_path, "x.jsonl", {"path": "t"})
    with pytest.raises(ConfigError, match=r"runner.address 'tcp://s:8786' for kind ray: give auto, ray://"):
        parse_config({**data, "runner": {"kind": "ray", "address": "tcp://s:8786"}})
    for address in (None, "auto", "ray://head:10001", "head:6379"):
        assert parse_config({**data, "runner": {"kind": "ray", "address": address}}).runner.address == address
