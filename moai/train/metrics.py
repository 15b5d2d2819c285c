"""Metrics: the JSON lines a run logs, its throughput window, and evaluation on the validation split.

Every record goes, from the main process only, to stdout (one JSON object a line: what
`moai.launch` reads and hands to its caller), to `<output_dir>/metrics.jsonl`, and to the tracker
(TensorBoard, MLflow, W&B; `moai.train.tracking`) once the step's checkpoint is written. A run
starting at step S first drops the lines after S (logged after the checkpoint it resumes from,
before a kill), so each step appears once.

A run over a mixed index (several sources) adds to each step line "tokens_by_source" (tokens read
from each source so far, `data.SourceTokens`) and to each eval line "eval_loss/<name>" per source;
the tracker gets them as `tokens/<name>` and `eval_loss/<name>`. Each source is evaluated on its
own first `eval_batches` global batches of validation samples (so a small source is measured as
well as a large one), and "eval_loss" is the mean over all those samples. One-source runs log
exactly the lines they always did.

Costs: a record is one small write and flush; the throughput window counts tokens on the device
(no wait per step) and costs one all-reduce when read; `evaluate` runs `eval_batches` forward
passes per rank (per source in a mixed run) and two all-reduces.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moai.config import TrainConfig
from moai.train.data import PackedDataset
from moai.train.tracking import Tracker, tracker_numbers, write_state

if TYPE_CHECKING:
    from collections.abc import Sequence

    from moai.train.data import Dataset

log = logging.getLogger(__name__)


def kept_metrics(lines: list[str], step: int) -> list[str]:
    """The metrics lines a run resuming at `step` keeps: those with a step <= `step`, and lines
    without one (events) that come before the first dropped line. Lines that are not a JSON object
    (one half-written by a kill) are dropped: they would also glue onto the next line appended."""
    kept: list[str] = []
    dropping = False
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            dropping = True
            continue
        at = record.get("step")
        if isinstance(at, (int, float)) and not isinstance(at, bool):
            if at <= step:
                kept.append(line)
            else:
                dropping = True
        elif not dropping:
            kept.append(line)
    return kept


def trim_metrics(path: Path, step: int) -> int:
    """Rewrite `path` with `kept_metrics(step)`; return how many lines were dropped. Written to a
    temporary file and renamed over it, so a kill during the rewrite leaves the old file whole."""
    if not path.is_file():
        return 0
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    kept = kept_metrics(lines, step)
    if not text or (len(kept) == len(lines) and text.endswith("\n")):
        return 0  # nothing to drop; a last line without its newline is rewritten with one
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(lines) - len(kept)


class MetricsWriter:
    """The run's record sink: stdout, metrics.jsonl and the tracker, on the main process only.

    Opening it for a run that starts at `start_step` first drops the lines logged after that step
    by the run before (`trim_metrics`): it must be opened before the first new line is written.
    The tracker (`moai.train.tracking`) gets the lines of `metrics.jsonl` it was not given yet up
    to `start_step` at once, then each new line at the next `commit` (after a checkpoint).
    """

    def __init__(
        self,
        accelerator,
        output_dir: Path,
        start_step: int = 0,
        tracker: Tracker | None = None,
        logged_through: int = 0,
    ):
        self.accelerator = accelerator
        self.out = output_dir
        self.file = None
        self.tracker = tracker if accelerator.is_main_process else None
        self.pending: list[tuple[dict[str, float], int]] = []
        if accelerator.is_main_process:
            path = output_dir / "metrics.jsonl"
            dropped = trim_metrics(path, start_step)
            if dropped:
                log.info(
                    "metrics.jsonl: dropped %d line(s) after step %d, logged before the previous run stopped; "
                    "this run logs those steps again",
                    dropped,
                    start_step,
                )
            if self.tracker is not None and path.is_file():
                for line in path.read_text(encoding="utf-8").splitlines():
                    self._queue(json.loads(line), after=logged_through)
                self.commit(start_step)
            self.file = open(path, "a")  # noqa: SIM115 (open for the run: close())

    def _queue(self, record: dict[str, Any], after: int = -1) -> None:
        numbers = tracker_numbers(record)
        if numbers and record["step"] > after:
            self.pending.append((numbers, record["step"]))

    def write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            return
        line = json.dumps(record)
        print(line, flush=True)  # the documented stdout protocol: moai.launch reads these lines
        self.file.write(line + "\n")
        self.file.flush()
        if self.tracker is not None:
            self._queue(record)

    def commit(self, step: int) -> None:
        """Give the tracker every line written so far (their checkpoint is saved) and record that
        it holds the lines up to `step`."""
        if self.tracker is None:
            return
        for numbers, at in self.pending:
            self.tracker.log(numbers, at)
        self.pending.clear()
        write_state(self.out, self.tracker, step)

    def artifact(self, folder: Path, name: str) -> None:
        if self.tracker is not None:
            self.tracker.artifact(folder, name)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tracker is not None:
            self.tracker.close()


class Throughput:
    """Tokens and seconds since the last log line. Tokens add up in a device tensor, so counting
    them never waits for the GPU; `read` all-reduces them over the ranks."""

    def __init__(self, device):
        import torch

        self.tokens = torch.zeros((), device=device, dtype=torch.float64)
        self.start = time.perf_counter()

    def count(self, batch: dict[str, Any]) -> None:
        # real tokens only: padding (unpacked mode) is not work done
        self.tokens += batch["attention_mask"].sum() if "attention_mask" in batch else batch["input_ids"].numel()

    def read(self, accelerator) -> tuple[int, float]:
        """(tokens over every rank, seconds) since the window started; collective: every rank calls it."""
        tokens = int(accelerator.reduce(self.tokens, "sum"))
        return tokens, time.perf_counter() - self.start

    def restart(self) -> None:
        self.start = time.perf_counter()
        self.tokens.zero_()


def _loss_sums(model, accelerator, data: Dataset, t: TrainConfig, pool: Sequence[int] | np.ndarray):
    """(summed per-sample loss, samples) on this rank over the first `eval_batches` global batches
    of the sample ids `pool`, still on the device."""
    import torch

    world, rank = accelerator.num_processes, accelerator.process_index
    total, count = torch.zeros((), device=accelerator.device), torch.zeros((), device=accelerator.device)
    for b in range(t.eval_batches):
        at = range((b * world + rank) * t.micro_batch_size, (b * world + rank + 1) * t.micro_batch_size)
        ids = [int(pool[p]) for p in at if p < len(pool)]
        if not ids:
            break
        host = data.collate([data[i] for i in ids])
        if not bool((host["labels"][:, 1:] != -100).any()):
            continue  # nothing to predict (chat prompt tokens only): its loss would be NaN
        batch = {k: v.to(accelerator.device) for k, v in host.items()}
        with accelerator.autocast():
            out = model(**batch, use_cache=False)
        total += out.loss.float() * len(ids)
        count += len(ids)
    return total, count


def source_pools(data: Dataset) -> list[np.ndarray] | None:
    """Each source's validation sample ids in stored order; None for one source."""
    if not isinstance(data, PackedDataset) or len(data.source_names) < 2:
        return None
    ids = np.asarray(data.samples.source_ids)
    return [np.flatnonzero(ids == k) for k in range(len(data.source_names))]


def evaluate(model, accelerator, data: Dataset | None, t: TrainConfig) -> float | None:
    """Mean loss over the first `eval_batches` global batches of `data`, split over the ranks."""
    losses = evaluate_sources(model, accelerator, data, t, None)
    return None if losses is None else losses[0]


def evaluate_sources(
    model, accelerator, data: Dataset | None, t: TrainConfig, pools: list[np.ndarray] | None
) -> tuple[float, list[float | None]] | None:
    """(mean loss over every evaluated sample, each pool's mean loss or None when it is empty); the
    pools are sample ids (None: the whole split, in order, as one pool); collective: two all-reduces."""
    import torch

    if data is None or len(data) == 0:
        return None
    model.eval()
    every: list[Sequence[int] | np.ndarray] = list(pools) if pools else [range(len(data))]
    with torch.no_grad():
        sums = [_loss_sums(model, accelerator, data, t, pool) for pool in every]
    model.train()
    total = accelerator.reduce(torch.stack([s[0] for s in sums]), "sum")
    count = accelerator.reduce(torch.stack([s[1] for s in sums]), "sum")
    if float(count.sum()) == 0:
        return None
    each = [float(total[k] / count[k]) if count[k] > 0 else None for k in range(len(sums))]
    return float(total.sum() / count.sum()), each


def eval_line(
    model, accelerator, data: Dataset | None, t: TrainConfig, step: int, metrics: MetricsWriter
) -> dict[str, Any] | None:
    """Evaluate and write the eval record (loss and perplexity, and each source's loss in a mixed
    run); None when there is nothing to evaluate."""
    pools = None if data is None else source_pools(data)
    losses = evaluate_sources(model, accelerator, data, t, pools)
    if losses is None:
        return None
    loss, each = losses
    line: dict[str, Any] = {"step": step, "eval_loss": round(loss, 6), "eval_ppl": round(math.exp(min(loss, 50)), 4)}
    if pools is not None:
        assert data is not None
        names = data.source_names
        line.update({f"eval_loss/{n}": round(v, 6) for n, v in zip(names, each, strict=True) if v is not None})
    metrics.write(line)
    return line
