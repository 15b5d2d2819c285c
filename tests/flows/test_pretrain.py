"""The Prefect flow on a real (test-harness) Prefect server: stages run, then Cached, and a
deleted output is rebuilt instead of returned."""

import base64
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


def _artifacts(flow_state) -> dict[str, object]:
    """The run's artifacts with a key, by key (the newest data of each)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    run_id = flow_state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        by_run = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        found = client.read_artifacts(artifact_filter=by_run)
    return {a.key: a for a in found if a.key}


def _versions(flow_state, key: str) -> list[str]:
    """Every version of the run's artifact `key`, oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    run_id = flow_state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]), key=ArtifactFilterKey(any_=[key])
            )
        )
    return [a.data for a in sorted(found, key=lambda a: a.created)]


def test_a_finished_run_shows_its_overview_and_training_chart_and_a_rerun_tells_the_truth(
    prefect_server, pretrain, tmp_path, corpus
):
    """What the UI draws, checked through the API: a finished run has the overview (every stage in
    pipeline order) and the training card with its SVG chart; a cached rerun says reused everywhere
    and does not launch training again."""
    from moai.presets import tiny

    train = tiny().train.model_copy(
        update={"output_dir": str(tmp_path / "run"), "max_steps": 6, "log_every": 2, "eval_every": 4, "save_every": 6}
    )
    cfg = parse_config(config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}})).model_copy(
        update={"train": train}
    )

    first = pretrain(cfg, return_state=True)
    assert first.is_completed(), first
    found = _artifacts(first)
    overview = found["overview"].data
    assert overview.startswith("# Data stages: 6 built, 0 reused"), overview[:200]
    order = [overview.index(f"| {s} | built |") for s in ["convert", "filter", "save", "tokenizer", "tokenize", "pack"]]
    assert order == sorted(order) and "file://" not in overview and "Document lengths" in overview
    card = found["training"].data
    prefix = "data:image/svg+xml;base64,"
    assert prefix in card and "**Finished**: step 6 of 6" in card, card[:500]
    svg = base64.b64decode(card.split(prefix, 1)[1].split(")", 1)[0]).decode()
    assert "<svg" in svg and "loss (smoothed)" in svg and str(tmp_path / "run") in svg
    assert found["train-progress"].data == 100.0
    assert not any(k.endswith("-output") for k in found)  # no file:// link cards
    # the biggest loss jumps, traced to their documents' files and rows: made at the first eval (step 4)
    # while training ran, then once more at the end (each a version of the card, oldest first)
    spikes = _versions(first, "loss-spikes")
    assert [s.split("\n")[2] for s in spikes] == [
        "_As of the eval at step 4, while training._",
        "_As of the end of training (step 6)._",
    ], [s[:200] for s in spikes]
    for card in spikes:
        assert "## Step " in card and f"`{corpus}:" in card, card[:500]
    assert "## Step 6" in spikes[1]  # (the eval's card has the steps logged when it was made: racing the run here)

    second = pretrain(cfg, return_state=True)
    assert second.is_completed(), second
    out = second.result()
    assert all(not s["built"] for s in out["stages"].values()), out["stages"]
    assert out["train"]["status"] == "finished"
    found = _artifacts(second)
    assert found["overview"].data.startswith("# Data stages: 0 built, 6 reused")
    card = found["training"].data
    assert "not launched again" in card and prefix in card
