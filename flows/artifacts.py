"""What the pretrain flow shows in the Prefect UI: pure renderers, then the few calls that publish.

The renderers (`report_rows`, `packing_markdown`, `loss_curve_markdown`) take plain data and
return table rows or markdown; they import nothing from Prefect and are unit-tested. The
`publish_*` functions hand their output to Prefect's artifact API and only run inside a flow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from moai.hardware import Plan
from moai.pipeline import StageResult

# -- pure: data in, rows or markdown out -------------------------------------------------------------


def report_rows(result: StageResult) -> list[dict[str, str]]:
    """A stage's report as field/value rows, plus where its output is and whether it was built now."""
    flat = {
        k: (json.dumps(v) if isinstance(v, (dict, list)) else v)
        for k, v in result.report.items()
        if k not in ("splits",)
    }
    rows = [{"field": k, "value": str(v)} for k, v in flat.items()]
    return [*rows, {"field": "output", "value": result.path}, {"field": "built now", "value": str(result.built)}]


def packing_markdown(pack: StageResult) -> str:
    """Document-length histogram and packing efficiency of the train split, as markdown."""
    train = pack.report["splits"]["train"]
    most = max((b["documents"] for b in train["length_histogram"]), default=1) or 1
    rows = "\n".join(
        f"| {b['from']}–{b['to'] if b['to'] is not None else '∞'} | {b['documents']:,} "
        f"| {'█' * round(30 * b['documents'] / most)} |"
        for b in train["length_histogram"]
        if b["documents"]
    )
    return (
        f"# Packing (train split)\n\n- samples: {train['samples']:,} × {pack.report['seq_len']} tokens\n"
        f"- tokens used: {train['tokens_used']:,} of {train['tokens']:,} ({100 * train['fraction_used']:.2f}%),"
        f" padding: 0\n- documents split across samples: {train['documents_split']:,} of {train['documents']:,}\n"
        f"- mean document length: {train['mean_document_tokens']} tokens\n\n"
        f"## Document lengths (tokens)\n\n| length | documents | |\n|---|---:|---|\n{rows}\n"
    )


def loss_curve_markdown(metrics_file: Path, width: int = 60, height: int = 12) -> str:
    """The loss curve as a text chart plus a table, for a markdown artifact."""
    points = [(r["step"], r["loss"]) for r in map(json.loads, metrics_file.read_text().splitlines()) if "loss" in r]
    if not points:
        return "# Loss curve\n\nno loss lines yet"
    steps, losses = zip(*points, strict=True)
    lo, hi = min(losses), max(losses)
    grid = [[" "] * width for _ in range(height)]
    for s, v in points:
        x = round((s - steps[0]) / max(1, steps[-1] - steps[0]) * (width - 1))
        y = round((hi - v) / ((hi - lo) or 1) * (height - 1))
        grid[y][x] = "•"
    chart = "\n".join(f"{hi - (hi - lo) * i / (height - 1):8.3f} │{''.join(row)}" for i, row in enumerate(grid))
    chart += f"\n{'':8} └{'─' * width}\n{'':10}step {steps[0]} … {steps[-1]}"
    table = "| step | loss |\n|---:|---:|\n" + "\n".join(f"| {s} | {v:.4f} |" for s, v in points)
    return f"# Loss curve\n\n```\n{chart}\n```\n\n{table}\n"


def summary_markdown(out: dict[str, Any]) -> str:
    return (
        f"# moai data\n\n- token store: `{out['token_store']}`\n- sample index: `{out['sample_index']}`\n"
        f"- documents: {out['num_documents']:,}\n- tokens: {out['num_tokens']:,}\n"
    )


TRAIN_SHOWN = ("step", "loss", "eval_loss", "eval_ppl", "tokens_per_s", "mfu", "grad_norm", "lr", "final_model")


def train_rows(last: dict[str, Any]) -> list[dict[str, str]]:
    return [{"metric": k, "value": str(last.get(k))} for k in TRAIN_SHOWN]


# -- publishing: Prefect's artifact API, inside a flow run --------------------------------------------


def publish_plan(plan: Plan) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(plan.rows(), key="hardware-plan", description=f"Hardware plan: {plan.hardware}")


def publish_stage(result: StageResult) -> None:
    """A table of the stage's report and a link to its output folder."""
    from prefect.artifacts import create_link_artifact, create_table_artifact

    create_table_artifact(
        report_rows(result), key=f"stage-{result.stage}", description=f"{result.stage} report: {result.path}"
    )
    create_link_artifact(
        Path(result.path).as_uri(),
        link_text=result.path,
        key=f"stage-{result.stage}-output",
        description=f"{result.stage} output folder",
    )


def publish_markdown(markdown: str, key: str) -> None:
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(markdown, key=key)


def publish_training(last: dict[str, Any], output_dir: str) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(train_rows(last), key="train-summary", description=f"training: {output_dir}")
    publish_markdown(loss_curve_markdown(Path(output_dir) / "metrics.jsonl"), key="train-loss-curve")


class Progress:
    """A progress artifact created on the first report (a stage that never reports shows none)."""

    def __init__(self, key: str, description: str):
        self.key, self.description = key, description
        self.id: UUID | None = None

    def __call__(self, fraction: float) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        if self.id is None:
            # typed for sync and async callers alike (UUID | Coroutine); called from sync code it returns the UUID
            self.id = cast(UUID, create_progress_artifact(0.0, key=self.key, description=self.description))
        update_progress_artifact(self.id, 100.0 * fraction)
