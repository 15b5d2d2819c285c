"""The Prefect flow on a real (test-harness) Prefect server: stages run, then Cached, and a
deleted output is rebuilt instead of returned."""

import shutil
from pathlib import Path

from conftest import config_dict
from moai.config import parse_config

DATA_STAGES = {"convert", "filter", "save", "tokenizer", "tokenize", "pack"}


def task_states(flow_state, expected: set[str] = DATA_STAGES, wait_s: float = 20) -> dict[str, str]:
    """Final state name of each task of a flow run, read back from the server (states arrive asynchronously)."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run_id = flow_state.state_details.flow_run_id
    deadline = time.monotonic() + wait_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            states = {r.name.rsplit("-", 1)[0]: r.state for r in runs}
            done = expected <= set(states) and all(states[s] is not None and states[s].is_final() for s in expected)
            if done or time.monotonic() > deadline:
                return {name: (st.name if st else None) for name, st in states.items()}
            time.sleep(0.2)


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
