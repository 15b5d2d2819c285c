"""What the pretrain flow shows in the Prefect UI: pure renderers, then the few calls that publish.

The run shows few cards, each one kept up to date instead of added again: the `overview` (every
stage in pipeline order, then each stage's detail and the packing histogram), the `training`
view (chart and latest figures, `flows/training_view.py`), the hardware plan and progress bars,
and a link to the training's MLflow run when train.tracker is mlflow on an http tracking server.
Prefect lists a run's cards in artifact-id order, which is random (docs/FIELD-NOTES.md), so the
order that matters lives inside one card. Paths are text: a `file://` link opens nothing in a
browser, and the path is on the worker, not the viewer's machine.

The renderers take plain data and return markdown or rows; they import nothing from Prefect and
are unit-tested. `LiveMarkdown`, `Progress` and `publish_*` call Prefect's artifact API and only
run inside a flow.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from moai.config import PipelineConfig
from moai.hardware import Plan
from moai.pipeline import StageResult

# -- pure: formatting ------------------------------------------------------------------------------


def number(v: Any) -> str:
    """A number as a reader wants it: thousands separators, 4 significant digits, tiny or huge
    floats in scientific notation; None as an em dash."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e9):
            return f"{v:.2e}"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(v)


def value(v: Any) -> str:
    """Any report value as one short line: dicts as `key value, …`, lists comma-joined."""
    if isinstance(v, Mapping):
        return ", ".join(f"{k} {number(x)}" for k, x in v.items()) or "none"
    if isinstance(v, (list, tuple)):
        return ", ".join(value(x) for x in v) or "none"
    return number(v)


def duration(seconds: float | None) -> str:
    """12 s, 3 min 05 s, 2 h 04 min."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    s = round(seconds)
    if s < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def hardware_text(plan: Plan) -> str:
    h = plan.hardware
    gpus = f"{len(h.gpus)} GPU ({', '.join(sorted(set(h.gpus)))})" if h.gpus else "no GPU"
    return (
        f"{h.cores} cores, {h.mem_available_gb:.1f} GB memory free, {gpus}, "
        f"{h.disk_free_gb:,.0f} GB free on {h.disk_type} disk"
    )


# -- pure: the overview -------------------------------------------------------------------------------


def _rows_text(report: dict[str, Any]) -> str:
    if "rows_in" in report and "rows_out" in report:
        return f"{number(report['rows_in'])} → {number(report['rows_out'])}"
    return number(report.get("documents")) if "documents" in report else "—"


def _compact(x: float) -> str:
    """3,272 → 3.3k, 275,648 → 276k, 1,497,000 → 1.5M: a rate read at a glance, in a narrow column."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.{1 if x < 10 * scale else 0}f}{unit}"
    return f"{x:.0f}"


def _throughput(report: dict[str, Any]) -> str:
    seconds = report.get("seconds")
    if "tokens_per_s" in report:
        return f"{_compact(report['tokens_per_s'])} tokens/s"
    if isinstance(report.get("mb_per_s"), (int, float)):
        return f"{report['mb_per_s']:,.1f} MB/s"
    rows = report.get("rows_in", report.get("documents"))
    if isinstance(rows, int) and isinstance(seconds, (int, float)) and seconds > 0:
        return f"{_compact(rows / seconds)} rows/s"
    return "—"


def overview_rows(results: Mapping[str, StageResult], cache_dir: str | None = None) -> list[dict[str, str]]:
    """One row per stage, in pipeline order (the order of `results`): what a reader scans first.
    Outputs under `cache_dir` are shown by their key (the overview names the cache and the layout once)."""

    def where(path: str) -> str:
        if cache_dir is not None:
            with contextlib.suppress(ValueError):
                return Path(path).relative_to(Path(cache_dir).resolve()).name  # the key: <cache>/<stage>/<key>
        return path

    return [
        {
            "stage": name,
            "status": "built" if r.built else "reused",
            "rows in → out": _rows_text(r.report),
            "dropped": value(r.report["dropped"]) if "dropped" in r.report else "—",
            "tokens": number(r.report.get("tokens")),
            "seconds": number(r.report.get("seconds")) if r.built else "—",
            "throughput": _throughput(r.report) if r.built else "—",
            "output": where(r.path),
        }
        for name, r in results.items()
    ]


def artifact_key(name: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for a node name such as `tokenize[ko]`."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def markdown_table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return ""
    head = list(rows[0])
    cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(r[k]) for k in head) + " |" for r in rows]
    return "\n".join(lines)


DETAIL_HIDDEN = ("splits", "rows_in", "rows_out", "dropped", "seconds", "warnings", "sources")


def stage_detail(result: StageResult, config: PipelineConfig | None = None) -> str:
    """A stage's report, beyond the overview's columns, as a short list."""
    report = result.report
    lines = [f"- {k.replace('_', ' ')}: {value(v)}" for k, v in report.items() if k not in DETAIL_HIDDEN and v]
    trained = config.tokenizer.train if config is not None else None
    if result.stage == "tokenizer" and trained is not None and report.get("vocab_size", 0) < trained.vocab_size:
        lines = [
            f"- vocab size: {number(report['vocab_size'])} ({number(trained.vocab_size)} asked: the corpus has "
            "too few distinct merges for more)"
            if line.startswith("- vocab size")
            else line
            for line in lines
        ]
    lines += [f"- warning: {w}" for w in report.get("warnings") or []]
    lines.append(f"- {'built in this run' if result.built else 'reused from the cache'}: `{result.path}`")
    return f"### {result.stage}\n\n" + "\n".join(lines)


def overview_markdown(
    results: Mapping[str, StageResult], config: PipelineConfig | None = None, plan: Plan | None = None
) -> str:
    """The run's overview: the stage table in pipeline order, then each stage's detail (packing with
    its histogram)."""
    built = sum(r.built for r in results.values())
    head = f"# Data stages: {built} built, {len(results) - built} reused"
    cache_dir = str(Path(config.cache_dir).resolve()) if config is not None else None
    if cache_dir is not None:
        head += f"\n\nOutputs are folders `<stage>/<key>` under the cache `{cache_dir}` (output: the key)."
    if plan is not None:
        head += f"\n\nOn {hardware_text(plan)}."
    if config is not None and (config.train is None or not config.train.enabled):
        why = "no train section" if config.train is None else "train.enabled is false"
        head += f"\n\nNo training in this run ({why}): the data is prepared, nothing is trained."
    parts = [head, markdown_table(overview_rows(results, cache_dir)), "## Stage detail"]
    for r in results.values():
        parts.append(stage_detail(r, config))
        if r.stage == "pack" and "splits" in r.report:
            parts.append(packing_markdown(r, heading="####"))
        if r.stage == "mix" and "sources" in r.report:
            parts.append(mix_markdown(r, heading="####"))
    return "\n\n".join(parts) + "\n"


def mix_markdown(mix: StageResult, heading: str = "#") -> str:
    """The mix stage's sources: weight, tokens available, target and realised tokens, samples, epochs."""
    rows = [
        {
            "source": s["name"],
            "weight": f"{s['weight']:g} ({100 * s['share']:.2f}%)",
            "tokens available": number(s["tokens_available"]),
            "target tokens": number(s["target_tokens"]),
            "realised tokens": number(s["realised_tokens"]),
            "realised share": f"{100 * s['realised_share']:.2f}%",
            "samples": number(s["samples"]),
            "epochs": f"{s['epochs']:g} (max {s['max_repetition']:g})",
            "validation samples": number(s["validation_samples"]),
        }
        for s in mix.report["sources"]
    ]
    total = f"{number(mix.report['tokens'])} tokens, {number(mix.report['samples']['train'])} samples"
    return f"{heading} Mix (train split)\n\n- budget: {total} ({mix.report['total_from']})\n\n{markdown_table(rows)}\n"


def bar(count: int, most: int, width: int = 30) -> str:
    """A histogram bar: none for an empty bucket, at least one block for a non-empty one."""
    return "" if count <= 0 else "█" * max(1, round(width * count / max(1, most)))


def packing_markdown(pack: StageResult, heading: str = "#") -> str:
    """Document-length histogram and packing efficiency of the train split, as markdown."""
    train = pack.report["splits"]["train"]
    most = max((b["documents"] for b in train["length_histogram"]), default=1) or 1
    rows = "\n".join(
        f"| {b['from']:,}–{number(b['to']) if b['to'] is not None else '∞'} | {b['documents']:,} "
        f"| {bar(b['documents'], most)} |"
        for b in train["length_histogram"]
    )
    return (
        f"{heading} Packing (train split)\n\n- samples: {train['samples']:,} × {pack.report['seq_len']:,} tokens\n"
        f"- tokens used: {train['tokens_used']:,} of {train['tokens']:,} ({100 * train['fraction_used']:.2f}%),"
        f" padding: {100 * train.get('padding_fraction', 0.0):.3f}%"
        f" ({pack.report.get('mode', 'concat')})\n"
        f"- documents split across samples: {train['documents_split']:,} of {train['documents']:,}\n"
        f"- mean document length: {train['mean_document_tokens']} tokens\n\n"
        f"{heading}# Document lengths (tokens)\n\n| length | documents | |\n|---|---:|---|\n{rows}\n"
    )


# -- publishing: Prefect's artifact API, inside a flow run --------------------------------------------


def literal(text: str) -> str:
    """Corpus text shown as it is in Markdown: its emphasis, code, link and HTML marks escaped
    (`__init__` stays `__init__`, not a bold "init"); table pipes are `markdown_table`'s to escape."""
    return re.sub(r"([\\`*_\[\]<>~])", r"\\\1", text)


def spikes_markdown(spikes: list[dict[str, Any]], when: str | None = None) -> str:
    """The run's biggest loss jumps and the documents in their batches (`moai.trace.loss_spikes`);
    `when`: what the card is as of ("at the eval of step 400, while training")."""
    head = "# Loss spikes\n\n" + (f"_As of {when}._\n\n" if when else "")
    if not spikes:
        return head + "No logged loss yet.\n"
    parts = [
        head + "The logged steps whose loss jumped most over the 10 logged before, and the "
        "documents that filled most of each batch (`moai trace CONFIG --step N` lists them all).\n"
    ]
    for s in spikes:
        rows = [
            {
                "document": f"`{d['where']}`",
                "source": d["source"],
                "tokens": number(d["tokens"]),
                "starts with": literal(" ".join(d["preview"].split())[:60]),
            }
            for d in s["documents"]
        ]
        parts.append(
            f"## Step {s['step']:,}: loss {s['loss']:.4f} ({s['jump']:+.4f})\n\n"
            f"{number(s['num_documents'])} documents in the batch; the largest:\n\n{markdown_table(rows)}\n"
        )
    return "\n".join(parts)


def publish_plan(plan: Plan) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(plan.rows(), key="hardware-plan", description=f"Hardware plan on {hardware_text(plan)}")


def publish_link(key: str, link: str, text: str, description: str) -> None:
    """A link card (an http URL: the browser opens it, unlike a file:// path)."""
    from prefect.artifacts import create_link_artifact

    create_link_artifact(link, link_text=text, key=key, description=description)


class LiveMarkdown:
    """A markdown artifact created once and then updated in place: the run keeps one card that
    always shows the newest content (creating it again would add a version per update)."""

    def __init__(self, key: str, description: str | None = None):
        self.key, self.description = key, description
        self.id: UUID | None = None

    def __call__(self, markdown: str) -> None:
        from prefect.artifacts import create_markdown_artifact
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactUpdate

        if self.id is None:
            self.id = cast(UUID, create_markdown_artifact(markdown, key=self.key, description=self.description))
            return
        with get_client(sync_client=True) as client:
            client.update_artifact(self.id, ArtifactUpdate(data=markdown))


class Progress:
    """A progress artifact created on the first report (a stage that never reports shows none)."""

    def __init__(self, key: str, description: str):
        self.key, self.description = key, description
        self.id: UUID | None = None

    def __call__(self, fraction: float, description: str | None = None) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        if self.id is None:
            # typed for sync and async callers alike (UUID | Coroutine); called from sync code it returns the UUID
            self.id = cast(UUID, create_progress_artifact(0.0, key=self.key, description=self.description))
        update_progress_artifact(self.id, 100.0 * fraction, description=description)
