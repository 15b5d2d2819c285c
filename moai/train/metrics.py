"""Metrics: the JSON lines a run logs, its throughput window, and evaluation on the validation split.

Every record goes, from the main process only, to stdout (one JSON object a line: what
`moai.launch` reads and hands to its caller), to `<output_dir>/metrics.jsonl`, and to the tracker
(TensorBoard, MLflow) when there is one. A run starting at step S first drops the lines after S
(logged after the checkpoint it resumes from, before a kill), so each step appears once.

Costs: a record is one small write and flush; the throughput window counts tokens on the device
(no wait per step) and costs one all-reduce when read; `evaluate` runs `eval_batches` forward
passes per rank and two all-reduces.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moai.config import TrainConfig

if TYPE_CHECKING:
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
    """

    def __init__(self, accelerator, output_dir: Path, start_step: int = 0):
        self.accelerator = accelerator
        self.file = None
        if accelerator.is_main_process:
            dropped = trim_metrics(output_dir / "metrics.jsonl", start_step)
            if dropped:
                log.info(
                    "metrics.jsonl: dropped %d line(s) after step %d, logged before the previous run stopped; "
                    "this run logs those steps again",
                    dropped,
                    start_step,
                )
            self.file = open(output_dir / "metrics.jsonl", "a")  # noqa: SIM115 (open for the run: close())

    def write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            return
        line = json.dumps(record)
        print(line, flush=True)  # the documented stdout protocol: moai.launch reads these lines
        self.file.write(line + "\n")
        self.file.flush()
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step" and v is not None}
        if numbers:
            self.accelerator.log(numbers, step=record["step"])

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


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


def evaluate(model, accelerator, data: Dataset | None, t: TrainConfig) -> float | None:
    """Mean loss over the first `eval_batches` global batches of `data`, split over the ranks."""
    import torch

    if data is None or len(data) == 0:
        return None
    model.eval()
    world, rank = accelerator.num_processes, accelerator.process_index
    total, count = torch.zeros((), device=accelerator.device), torch.zeros((), device=accelerator.device)
    with torch.no_grad():
        for b in range(t.eval_batches):
            ids = [
                i
                for i in range((b * world + rank) * t.micro_batch_size, (b * world + rank + 1) * t.micro_batch_size)
                if i < len(data)
            ]
            if not ids:
                break
            batch = {k: v.to(accelerator.device) for k, v in data.collate([data[i] for i in ids]).items()}
            with accelerator.autocast():
                out = model(**batch, use_cache=False)
            total += out.loss.float() * len(ids)
            count += len(ids)
    model.train()
    total, count = accelerator.reduce(total, "sum"), accelerator.reduce(count, "sum")
    return float(total / count) if count > 0 else None


def eval_line(
    model, accelerator, data: Dataset | None, t: TrainConfig, step: int, metrics: MetricsWriter
) -> dict[str, Any] | None:
    """Evaluate and write the eval record (loss and perplexity); None when there is nothing to evaluate."""
    loss = evaluate(model, accelerator, data, t)
    if loss is None:
        return None
    line = {"step": step, "eval_loss": round(loss, 6), "eval_ppl": round(math.exp(min(loss, 50)), 4)}
    metrics.write(line)
    return line
