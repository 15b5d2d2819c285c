"""The Prefect flow on a real (test-harness) Prefect server: stages run, then Cached, and a
deleted output is rebuilt instead of returned."""

import shutil
from pathlib import Path

import pytest

from conftest import DATA_STAGES, config_dict, task_states
from moai.config import parse_config

# The flow runs on the session's Prefect test server.
pytestmark = pytest.mark.slow


def test_flow_runs_caches_and_rebuilds(prefect_server, pretrain, tmp_path, corpus):
    cfg = parse_config(config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}}))

    first = pretrain(cfg, return_state=True)
    assert first.is_completed(), first
    states = task_states(first)
    assert set(states) >= DATA_STAGES and all(states[s] == "Completed" for s in DATA_STAGES), states
    result = first.result()
    assert Path(result["token_store"]).is_dir() and result["num_tokens"] > 0

    second = pretrain(cfg, return_state=True)
    states = task_states(second)
    assert all(states[s] == "Cached" for s in DATA_STAGES), states
    assert second.result()["token_store"] == result["token_store"]

    shutil.rmtree(result["sample_index"])
    third = pretrain(cfg, return_state=True)
    states = task_states(third)
    assert states["pack"] == "Completed" and states["tokenize"] == "Cached", states
    assert Path(third.result()["sample_index"]).is_dir()
