"""The training card and log lines (pure), the chart (matplotlib, no Prefect), and the run form's schema."""

from __future__ import annotations

import base64
import json
import math

import pytest

from flows import charts, training_view
from moai.config import TrainConfig

RECORDS = [
    {"event": "start", "step": 0, "world_size": 1, "device": "cpu", "parameters": 123456, "resumed": False},
    *(
        {
            "step": s,
            "loss": 6 - s / 100,
            "grad_norm": 0.5,
            "lr": 0.0003051371575761435,
            "tokens_per_s": 12345.6,
            "mfu": 0.1234,
            "tokens": s * 1000,
            "max_steps": 100,
        }
        for s in range(5, 101, 5)
    ),
    {"step": 50, "eval_loss": 5.5, "eval_ppl": math.exp(5.5)},
]


def test_log_lines_are_readable_not_json():
    line = training_view.log_line(RECORDS[1], max_steps=100)
    assert line == "step 5 of 100: loss 5.9500, 12,346 tokens/s, MFU 12.3%, grad norm 0.5, lr 3.05e-04"
    assert training_view.log_line(RECORDS[-1]) == "eval at step 50: loss 5.5000, perplexity 244.7"
    assert "123,456 parameters" in training_view.log_line(RECORDS[0])
    assert training_view.log_line({"event": "other"}) is None


def test_training_card_shows_latest_figures_and_what_it_shows():
    md = training_view.training_markdown(
        RECORDS, output_dir="/runs/a", max_steps=200, status="running", elapsed_s=65, eta_s=70, chart="![c](x)"
    )
    assert md.startswith("# Training: /runs/a") and "step 100 of 200" in md and "![c](x)" in md
    assert "| lr | 3.05e-04 |" in md and "| MFU | 12.3% |" in md and "| tokens/s | 12,346 |" in md
    assert "| eval loss / perplexity | 5.5 / 244.7 (step 50) |" in md
    assert "| elapsed | 1 min 05 s |" in md and "| ETA | 1 min 10 s |" in md
    assert "From `/runs/a/metrics.jsonl`, steps 5–100." in md


def test_training_card_of_a_run_finished_before_says_it_was_not_launched():
    md = training_view.training_markdown(RECORDS, output_dir="/runs/a", max_steps=100, status="finished-before")
    assert "not launched again" in md and "| ETA | — |" in md and "| elapsed | — |" in md


def test_chart_is_a_small_svg_data_uri_with_labelled_axes(tmp_path):
    many = [{"step": s, "loss": 5 + math.sin(s), "tokens_per_s": 1000.0 + s, "mfu": 0.1} for s in range(1, 20001)]
    svg = charts.training_svg([*many, {"step": 20000, "eval_loss": 4.0}], "/runs/a · steps 1–20,000", resumed_at=500)
    assert svg.startswith("<?xml") and "<svg" in svg
    for label in ("loss (smoothed)", "eval loss", "tokens/s", "MFU %", "step", "resumed at 500", "/runs/a"):
        assert label in svg, label
    assert len(svg) < 120_000, len(svg)  # 20,000 points thinned to a few hundred
    md = training_view.chart_markdown(RECORDS, "/runs/a", 100, None)
    prefix = "![loss, eval loss, tokens/s and MFU against step](data:image/svg+xml;base64,"
    assert md.startswith(prefix) and b"steps 5" in base64.b64decode(md[len(prefix) : -1])


def test_thin_ema_and_reading_metrics(tmp_path):
    points = [(i, float(i)) for i in range(1001)]
    thinned = charts.thin(points, 100)
    assert len(thinned) <= 100 and thinned[0] == (0, 0.0) and thinned[-1] == (1000, 1000.0)
    assert charts.ema([2.0, 2.0, 2.0], 5) == [2.0, 2.0, 2.0]  # bias-corrected: no pull towards 0
    f = tmp_path / "metrics.jsonl"
    f.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n" + '{"step": 2, "lo')  # a half-written last line
    assert charts.read_metrics(f) == [{"step": 1, "loss": 2.0}] and charts.read_metrics(tmp_path / "none") == []


def test_smoothed_loss_of_a_short_noisy_run_shows_its_trend():
    """150 logged steps (1,500 steps, log_every 10) of a plateau with noise: the smoothed curve
    moves under a fifth as much from point to point as the raw loss (a span of 4 points: a third)."""
    import itertools
    import random

    rng = random.Random(0)
    points = [(10 * i, 2.6 + rng.uniform(-0.4, 0.4)) for i in range(1, 151)]
    jumps = lambda vs: sum(abs(a - b) for a, b in itertools.pairwise(vs)) / (len(vs) - 1)  # noqa: E731
    raw, smooth = [v for _, v in points], [v for _, v in charts.smoothed(points)]
    assert jumps(smooth) < jumps(raw) / 5, (jumps(smooth), jumps(raw))
    assert abs(sum(smooth[20:]) / len(smooth[20:]) - 2.6) < 0.05  # no drift from the level


def _anyof_string_and_object(node, path="") -> list[str]:
    found = []
    if isinstance(node, dict):
        types = {option.get("type") for option in node.get("anyOf", []) if isinstance(option, dict)}
        if {"string", "object"} <= types:
            found.append(path)
        for k, v in node.items():
            found += _anyof_string_and_object(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _anyof_string_and_object(v, f"{path}[{i}]")
    return found


def test_run_form_schema_has_no_anyof_of_string_and_object(pretrain):
    """Prefect's run form fails on such a field ('SchemaFormPropertyAnyOf could not determine the
    initial index'); model_config has no type in the schema, which the form draws as a JSON box."""
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(pretrain).model_dump()
    assert _anyof_string_and_object(schema) == []
    model = schema["definitions"]["TrainConfig"]["properties"]["model_config"]
    assert "type" not in model and "anyOf" not in model
    # validation still takes a path and an inline dict
    assert TrainConfig.model_validate({"model_config": "configs/model.json"}).model == "configs/model.json"
    assert TrainConfig.model_validate({"model_config": {"model_type": "llama"}}).model == {"model_type": "llama"}


def test_a_mixed_run_shows_tokens_and_eval_loss_per_source():
    step = {**RECORDS[-2], "tokens_by_source": {"ko": 60_000, "code": 30_000, "en": 10_000}}
    evaluation = {**RECORDS[-1], "eval_loss/ko": 5.25, "eval_loss/code": 4.5, "eval_loss/en": 6.0}
    md = training_view.training_markdown([step, evaluation], output_dir="/runs/a", max_steps=100, status="running")
    assert "| tokens per source | ko 60.0% (60,000) · code 30.0% (30,000) · en 10.0% (10,000) |" in md
    assert "| eval loss per source | ko 5.25 · code 4.5 · en 6 |" in md
    line = training_view.log_line(evaluation)
    assert line == "eval at step 50: loss 5.5000, perplexity 244.7 (ko 5.25 · code 4.5 · en 6)"
    one = training_view.training_markdown(RECORDS, output_dir="/runs/a", max_steps=100, status="running")
    assert "per source" not in one  # one source: the card as it was


# Optional sections: None there is a choice the form must offer (one source or several, a tokenizer
# path or a trained one, prepare data only), so they keep an `X | None` switch.
# Optional sections keep their switch: None there is a choice (off), not a missing value.
SECTIONS = {
    "PipelineConfig": {"source", "sources", "train", "dedup", "quality", "language", "decontaminate"},
    "TokenizerConfig": {"train"},
    "DedupConfig": {"near"},
}


def test_run_form_schema_has_no_null_branch_for_an_optional_setting(pretrain):
    """Each `X | None` setting drew an `X | None` switch and `Property is type "None"` in Prefect's
    run form (27 of them, 9,614 px for the tiny deployment). An optional setting has neither a null
    branch nor a `default: null` in the schema (the form would send that null), and still validates
    None; Prefect's server check (`validate`, as with enforce_parameter_schema) takes explicit nulls."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import validate

    from moai.config import PipelineConfig
    from moai.presets import tiny

    schema = parameter_schema(pretrain).model_dump()
    null_branches, null_defaults = [], []
    for name, definition in schema["definitions"].items():
        for key, prop in definition.get("properties", {}).items():
            options = prop.get("anyOf", [])
            if {"type": "null"} in options and key not in SECTIONS.get(name, set()):
                null_branches.append(f"{name}.{key}")
            if not options and "default" in prop and prop["default"] is None:
                null_defaults.append(f"{name}.{key}")
    assert null_branches == [] and null_defaults == [], (null_branches, null_defaults)
    assert schema["definitions"]["FilterConfig"]["properties"]["max_chars"]["type"] == "integer"
    # validation is unchanged: an explicit None (a `key: null` in a YAML) is still a valid value
    dumped = tiny().model_dump(mode="json", by_alias=True)
    assert dumped["train"]["mixed_precision"] is None and dumped["filter"]["max_chars"] is None
    assert PipelineConfig.model_validate(dumped) == tiny()
    # and so is it for Prefect's server-side check of a deployment's parameters
    assert validate({"config": dumped}, schema, raise_on_error=False, ignore_required=True) == []


def test_the_card_leaves_starting_at_the_first_step(tmp_path):
    """The card is drawn at the launch's first line (starting, no chart), then at the first step at
    once, not REFRESH_S later (a screenshot 15 s into training still said 'starting'), then every
    REFRESH_S and at each eval; each time with the record that triggered it, which a rank prints
    before metrics.jsonl holds it (a card said 'step 0', 'no loss logged yet', at the first step)."""
    now = [0.0]
    view = training_view.TrainingView(str(tmp_path), 100, log=lambda line: None, clock=lambda: now[0])
    cards: list[str] = []
    view.card = cards.append  # type: ignore[assignment]
    view.progress = lambda fraction, description=None: None  # type: ignore[assignment]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("")

    def record(r: dict) -> None:  # a rank prints the record, then appends it to metrics.jsonl
        view.on_metrics(r)
        with open(metrics, "a") as f:
            f.write(json.dumps(r) + "\n")

    view.on_line("Loading the model")
    assert len(cards) == 1 and "accelerate is starting" in cards[0] and "data:image" not in cards[0]
    now[0] = 10.0
    record({"event": "start", "step": 0, "resumed": False})
    now[0] = 12.0
    record({"step": 10, "loss": 5.0, "lr": 1e-3, "tokens_per_s": 100.0})
    assert len(cards) == 2 and "**Training**: step 10 of 100." in cards[1] and "| loss | 5 |" in cards[1]
    assert "| MFU | — (no peak FLOPs known for this device) |" in cards[1]  # a CPU run: not a missing figure
    assert "data:image/svg+xml;base64," in cards[1] and "steps 10–10" in cards[1]
    now[0] = 14.0
    record({"step": 20, "loss": 4.0, "lr": 1e-3, "tokens_per_s": 100.0})
    assert len(cards) == 2  # not before REFRESH_S or an eval
    record({"step": 20, "eval_loss": 4.1, "eval_ppl": 60.3})
    assert len(cards) == 3 and "4.1 / 60.3 (step 20)" in cards[2]


@pytest.mark.slow
def test_the_run_links_to_the_mlflow_run_the_start_line_names(prefect_server, tmp_path):
    """The start line of a run with an MLflow tracker on an http server carries the run's URL; the
    Prefect run shows it as a link card (checked through the API of a real Prefect server)."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    url = "http://127.0.0.1:5000/#/experiments/1/runs/0123abcd"

    @flow
    def fake_launch():
        view = training_view.TrainingView(str(tmp_path), 10, log=lambda line: None)
        view.on_metrics({"event": "start", "step": 0, "resumed": False, "tracker_url": url})
        view.on_metrics({"event": "start", "step": 0, "resumed": False})  # none named: no card

    state = fake_launch(return_state=True)
    with get_client(sync_client=True) as client:
        by_run = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        found = client.read_artifacts(artifact_filter=by_run)
    # Prefect stores a link card as markdown holding the one link
    assert [a.data for a in found if a.key == "tracker-run"] == [f"[the tracker's run]({url})"]


def test_the_spikes_card_is_made_at_the_first_eval_then_at_most_every_spikes_s_and_at_the_end():
    now = [0.0]
    cards: list[str] = []
    calls = []

    def spikes():
        calls.append(now[0])
        return [{"step": 7, "loss": 5.0, "jump": 2.0, "num_documents": 1, "documents": []}]

    card = training_view.SpikesCard(
        spikes, log=lambda m: None, warn=lambda m: None, publish=cards.append, clock=lambda: now[0]
    )
    card.on_metrics({"step": 5, "loss": 3.0})  # a step: no card
    assert cards == []
    card.on_metrics({"step": 10, "eval_loss": 3.0})
    now[0] = training_view.SPIKES_S - 1
    card.on_metrics({"step": 20, "eval_loss": 3.0})  # too soon after the last one
    now[0] = training_view.SPIKES_S + 1
    card.on_metrics({"step": 30, "eval_loss": 3.0})
    card.finish({"step": 40})
    assert [c.split("\n")[2] for c in cards] == [
        "_As of the eval at step 10, while training._",
        "_As of the eval at step 30, while training._",
        "_As of the end of training (step 40)._",
    ]
    assert all("## Step 7: loss 5.0000 (+2.0000)" in c for c in cards) and len(calls) == 3


def test_a_spikes_card_that_cannot_be_made_is_a_warning_not_a_failure():
    warnings: list[str] = []

    def broken():
        raise OSError("metrics.jsonl: disk gone")

    card = training_view.SpikesCard(broken, log=lambda m: None, warn=warnings.append, publish=lambda m: None)
    card.on_metrics({"step": 10, "eval_loss": 3.0})
    card.finish({"step": 20})
    assert warnings == [
        "no loss-spikes card as of the eval at step 10, while training: OSError: metrics.jsonl: disk gone",
        "no loss-spikes card as of the end of training (step 20): OSError: metrics.jsonl: disk gone",
    ]
