"""The live training view: one `training` card (chart and latest figures), a progress bar that moves
from the launch on, and one readable log line per log step.

`TrainingView` is what `train_task` hands `launch_training` as its callbacks. The card is redrawn
at most every `REFRESH_S` seconds, and also at every eval and at the end of the run; the progress
bar at most every `PROGRESS_S`. The figures come from `<output_dir>/metrics.jsonl`, which holds the
whole history of that output_dir (a resumed run's earlier steps too), so the chart names its
output_dir and steps, and marks where this launch resumed. A run already at `max_steps` is not
launched again (`moai.pipeline.launch_training`): the card then says so and shows that run's final
figures from its metrics.jsonl.

`SpikesCard` keeps the `loss-spikes` card: the biggest loss jumps traced to their documents
(`moai.trace.LossSpikes`), made at the first eval, again at an eval `SPIKES_S` or more after the last
one, and at the end; each is a new version of the card, so its history shows how the spikes changed.
Tracing 3 steps (previews of the 15 documents shown only) costs up to an epoch order per step, ~0.4 s
of CPU per 10M samples, in the flow's process, never in the training processes (their output waits in
the pipe meanwhile); a card that cannot be made is a warning, never a failure.

The renderers (`training_markdown`, `log_line`) are pure and unit-tested; the classes call Prefect.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flows import charts
from flows.artifacts import LiveMarkdown, Progress, duration, markdown_table, number, publish_link, spikes_markdown

REFRESH_S = 30.0  # the training card: at most this often, plus every eval and the end
PROGRESS_S = 2.0  # the progress bar
STARTUP_SHARE = 0.02  # of the bar, filled while accelerate starts the processes (no step yet)
SPIKES_S = 60.0  # the loss-spikes card: at the first eval, then at an eval at least this long after the last


def percent(v: Any) -> str:
    return "—" if not isinstance(v, (int, float)) else f"{100 * v:.1f}%"


def latest(records: Sequence[dict[str, Any]], field: str) -> dict[str, Any]:
    """The newest record that carries `field`, else {}."""
    return next((r for r in reversed(records) if r.get(field) is not None), {})


def source_eval_losses(record: dict[str, Any]) -> str:
    """A mixed run's eval loss per source, "ko 2.31 · code 1.87"; "" for one source."""
    prefix = "eval_loss/"
    return " · ".join(f"{k[len(prefix) :]} {number(v)}" for k, v in record.items() if k.startswith(prefix))


def source_tokens(record: dict[str, Any]) -> str:
    """A mixed run's tokens read per source so far, with each one's share: "ko 61.0% (1,234) · …"."""
    counts = record.get("tokens_by_source") or {}
    total = sum(counts.values())
    return " · ".join(f"{name} {percent(n / total)} ({number(n)})" for name, n in counts.items()) if total else ""


def log_line(record: dict[str, Any], max_steps: int | None = None) -> str | None:
    """One readable line for a metrics record (the JSON itself stays in metrics.jsonl)."""
    if "loss" in record:
        of = f" of {max_steps:,}" if max_steps else ""
        return (
            f"step {record['step']:,}{of}: loss {record['loss']:.4f}, {number(record.get('tokens_per_s'))} tokens/s, "
            f"MFU {percent(record.get('mfu'))}, grad norm {number(record.get('grad_norm'))}, "
            f"lr {record.get('lr', 0):.2e}"
        )
    if "eval_loss" in record:
        ppl = number(record.get("eval_ppl"))
        each = source_eval_losses(record)
        by_source = f" ({each})" if each else ""
        return f"eval at step {record['step']:,}: loss {record['eval_loss']:.4f}, perplexity {ppl}{by_source}"
    if record.get("event") == "start":
        resumed = f"resumed at step {record['step']:,}" if record.get("resumed") else "from step 0"
        return (
            f"training started {resumed}: {record.get('world_size', 1)} process(es) on {record.get('device')}, "
            f"{number(record.get('parameters'))} parameters, {number(record.get('train_samples'))} samples "
            f"of {record.get('seq_len')} tokens"
        )
    if record.get("event") == "end":
        final = f", final model {record['final_model']}" if record.get("final_model") else ""
        return f"training stopped at step {record['step']:,}{final}"
    return None


def training_markdown(
    records: Sequence[dict[str, Any]],
    *,
    output_dir: str,
    max_steps: int,
    status: str,
    elapsed_s: float | None = None,
    eta_s: float | None = None,
    resumed_at: int | None = None,
    chart: str | None = None,
) -> str:
    """The training card. `status`: starting, running, done, stopped (before max_steps), or
    finished-before (already at max_steps, not relaunched)."""
    step_rec, eval_rec = latest(records, "loss"), latest(records, "eval_loss")
    end = latest(records, "final_model")
    step, mfu = step_rec.get("step", 0), step_rec.get("mfu")
    head = {
        "starting": "accelerate is starting the training processes (importing torch, building the model, "
        "opening the data); the first step follows.",
        "running": f"**Training**: step {step:,} of {max_steps:,}.",
        "done": f"**Finished**: step {step:,} of {max_steps:,}.",
        "stopped": f"**Stopped** at step {step:,} of {max_steps:,} (train.stop_after_steps); a rerun resumes here.",
        "finished-before": f"**Already finished**: this output_dir reached max_steps ({max_steps:,}) in an earlier "
        "run, so training was not launched again. The figures below are that run's, from its metrics.jsonl.",
    }[status]
    steps = [r["step"] for r in records if "loss" in r or "eval_loss" in r]
    shown = f"steps {min(steps):,}–{max(steps):,}" if steps else "no steps yet"
    rows = [
        ("step", f"{step:,} of {max_steps:,}"),
        ("loss", number(step_rec.get("loss"))),
        (
            "eval loss / perplexity",
            f"{number(eval_rec.get('eval_loss'))} / {number(eval_rec.get('eval_ppl'))} (step {eval_rec['step']:,})"
            if eval_rec
            else "—",
        ),
        ("tokens/s", number(step_rec.get("tokens_per_s"))),
        ("MFU", "— (no peak FLOPs known for this device)" if step_rec and mfu is None else percent(mfu)),
        ("grad norm", number(step_rec.get("grad_norm"))),
        ("lr", f"{step_rec['lr']:.2e}" if isinstance(step_rec.get("lr"), (int, float)) else "—"),
        ("tokens seen", number(step_rec.get("tokens"))),
        *([("tokens per source", source_tokens(step_rec))] if step_rec.get("tokens_by_source") else []),
        *([("eval loss per source", source_eval_losses(eval_rec))] if source_eval_losses(eval_rec) else []),
        ("elapsed", duration(elapsed_s)),
        ("ETA", duration(eta_s) if status == "running" else "—"),
    ]
    if end:
        rows.append(("final model", str(end["final_model"])))
    parts = [
        f"# Training: {output_dir}",
        head,
        chart or "",
        markdown_table([{"figure": k, "value": v} for k, v in rows]),
        f"From `{Path(output_dir) / 'metrics.jsonl'}`, {shown}"
        + (f"; this launch resumed at step {resumed_at:,}." if resumed_at else "."),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def chart_markdown(records: Sequence[dict[str, Any]], output_dir: str, max_steps: int, resumed_at: int | None) -> str:
    steps = [r["step"] for r in records if "loss" in r]
    span = f"steps {min(steps):,}–{max(steps):,} of {max_steps:,}" if steps else f"0 of {max_steps:,} steps"
    svg = charts.training_svg(records, f"{output_dir} · {span}", resumed_at=resumed_at)
    return charts.svg_image_markdown(svg, "loss, eval loss, tokens/s and MFU against step")


class TrainingView:
    """Callbacks for `launch_training` that keep the run's training card and progress bar current."""

    def __init__(
        self,
        output_dir: str,
        max_steps: int,
        log: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.output_dir, self.max_steps, self.log, self.clock = output_dir, max_steps, log, clock
        self.card = LiveMarkdown("training", f"training: {output_dir}")
        self.progress = Progress("train-progress", f"training: steps done of {max_steps:,}")
        self.link = publish_link
        self.launched = clock()
        self.started: float | None = None  # when this launch's first step was logged
        self.start_step = 0
        self.resumed_at: int | None = None
        self.lines = 0
        self.stepped = False  # a step of this launch has been drawn on the card
        self.last_card = self.last_progress = -1e18
        # Nothing is shown before the launch's first line: a finished run is never launched.

    def metrics_records(self) -> list[dict[str, Any]]:
        return charts.read_metrics(Path(self.output_dir) / "metrics.jsonl")

    def refresh(
        self, status: str, records: list[dict[str, Any]] | None = None, pending: dict[str, Any] | None = None
    ) -> None:
        """Redraw the card. `pending`: the record just read from the launch's stdout, which a rank
        prints before it appends it to metrics.jsonl, so the file may not hold it yet."""
        records = self.metrics_records() if records is None else records
        if pending is not None and pending not in records[-5:]:
            records.append(pending)
        step = latest(records, "loss").get("step", 0)
        now = self.clock()
        elapsed = now - self.launched
        eta = None
        if self.started is not None and step > self.start_step:
            eta = (now - self.started) / (step - self.start_step) * max(0, self.max_steps - step)
        drawn = any("loss" in r or "eval_loss" in r for r in records)  # no empty axes before the first step
        chart = chart_markdown(records, self.output_dir, self.max_steps, self.resumed_at) if drawn else None
        self.card(
            training_markdown(
                records,
                output_dir=self.output_dir,
                max_steps=self.max_steps,
                status=status,
                elapsed_s=elapsed if status != "finished-before" else None,
                eta_s=eta,
                resumed_at=self.resumed_at,
                chart=chart,
            )
        )
        self.last_card = now

    def on_line(self, line: str) -> None:
        """A line of the launch's output: a rank's log record goes to the run's logs (metrics lines
        are logged readably by `on_metrics`); while no step is logged yet, the bar creeps forward."""
        from moai.launch import RANK_RECORD

        if RANK_RECORD.match(line):
            self.log(line)
        if self.started is None:
            if self.lines == 0:
                self.launched = self.clock()
                self.refresh("starting", records=[])
            self.lines += 1
            now = self.clock()
            if now - self.last_progress >= PROGRESS_S:
                done = STARTUP_SHARE * (1 - 1 / (1 + self.lines / 20))
                self.progress(done, f"accelerate starting the training processes ({duration(now - self.launched)})")
                self.last_progress = now

    def on_metrics(self, record: dict[str, Any]) -> None:
        if (text := log_line(record, self.max_steps)) is not None:
            self.log(text)
        now = self.clock()
        if record.get("event") == "start":
            self.start_step = int(record.get("step", 0))
            self.resumed_at = self.start_step if record.get("resumed") else None
            self.started = now
            if url := record.get("tracker_url"):  # the MLflow run (train.tracker mlflow on an http server)
                self.link("tracker-run", url, "the tracker's run", f"training: {self.output_dir} in the tracker")
        if "loss" in record and now - self.last_progress >= PROGRESS_S:
            frac = STARTUP_SHARE + (1 - STARTUP_SHARE) * record["step"] / self.max_steps
            self.progress(frac, f"training: step {record['step']:,} of {self.max_steps:,}")
            self.last_progress = now
        first = "loss" in record and not self.stepped  # the card leaves "starting" at the first step
        if first or "eval_loss" in record or now - self.last_card >= REFRESH_S:
            self.refresh("running", pending=record)
        self.stepped = self.stepped or "loss" in record

    def finish(self, last: dict[str, Any]) -> None:
        """After the launch (or instead of it, when the run had finished before)."""
        before = last.get("status") == "finished"
        step = int(last.get("step") or 0)
        self.progress(
            1.0 if step >= self.max_steps else step / self.max_steps,
            "already at max_steps: not relaunched" if before else f"training: step {step:,} of {self.max_steps:,}",
        )
        self.refresh("finished-before" if before else "done" if step >= self.max_steps else "stopped")


def publish_spikes_card(markdown: str) -> None:
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(markdown, key="loss-spikes", description="Biggest loss jumps and their documents")


class SpikesCard:
    """The `loss-spikes` card of a training run (see the module doc). `spikes` returns what
    `moai.trace.loss_spikes` returns; `warn` logs a card that could not be made."""

    def __init__(
        self,
        spikes: Callable[[], list[dict[str, Any]]],
        log: Callable[[str], None],
        warn: Callable[[str], None],
        publish: Callable[[str], None] = publish_spikes_card,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.spikes, self.log, self.warn, self.publish, self.clock = spikes, log, warn, publish, clock
        self.last: float | None = None

    def on_metrics(self, record: dict[str, Any]) -> None:
        if "eval_loss" not in record:
            return
        if self.last is None or self.clock() - self.last >= SPIKES_S:
            self.update(f"the eval at step {record['step']:,}, while training")

    def finish(self, last: dict[str, Any]) -> None:
        step = last.get("step")
        self.update(f"the end of training (step {step:,})" if isinstance(step, int) else "the end of training")

    def update(self, when: str) -> None:
        started = self.clock()
        self.last = started
        try:
            spikes = self.spikes()
            self.publish(spikes_markdown(spikes, when))
        except Exception as err:  # the card is a convenience: training goes on (or is done and saved)
            self.warn(f"no loss-spikes card as of {when}: {type(err).__name__}: {err}")
            return
        self.log(f"loss-spikes card as of {when}: {len(spikes)} step(s) traced in {self.clock() - started:.2f} s")
