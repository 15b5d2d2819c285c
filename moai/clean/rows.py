"""What every cleaning stage does with its verdicts: keep rows, drop rows with a reason, count.

A cleaning stage decides, for each row of its input (a `save_to_disk` text folder), None (keep) or
a reason (`exact_duplicate`, `gopher:word_count`, `language:ja`, ...), optionally with a detail
(which row it copies, the measured value). `apply_verdicts` writes the kept rows as the stage's
output, in input order, and with `keep_dropped` every dropped row as `<out>/dropped/` (a
`save_to_disk` folder with `row` (its index in the stage's input), `reason`, `detail`, `text`,
`origin` (its file and row, `moai.formats.text`)). The kept rows keep their origins too.
`judge_rows` computes verdicts over row ranges in worker processes (the hardware plan's
processes); each worker maps the input itself, so no text crosses a pipe.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from moai.errors import DataError
from moai.formats.text import (
    TEXT_SCHEMA,
    DatasetWriter,
    MappedTable,
    copy_origin_files,
    origin_column,
    text_batch,
    text_bytes,
)
from moai.report import timing
from moai.workers import spawn_pool

log = logging.getLogger(__name__)

DROPPED_DIR = "dropped"
DROPPED_SCHEMA = pa.schema(
    [
        ("row", pa.int64()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("text", pa.string()),
        ("origin", pa.int64()),
    ]
)


@dataclass
class Verdicts:
    """The verdicts on rows [lo, hi): `reasons[i]` is None (kept) or why row lo + i is dropped."""

    lo: int
    hi: int
    reasons: list[str | None]
    details: list[str | None] | None = None
    counts: dict[str, int] = field(default_factory=dict)  # stage-specific tallies (e.g. code_exempt)


# A judge takes a batch of texts and the stage's parameters and returns (reasons, details, counts).
Judge = Callable[[pa.Array, Any], tuple[list[str | None], list[str | None] | None, dict[str, int]]]


def apply_verdicts(
    in_dir: Path,
    out_dir: Path,
    verdicts: Iterable[Verdicts],
    *,
    stage: str,
    keep_dropped: bool,
    max_shard_size: str,
    fix: str,
    on_progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Write the kept rows to `out_dir` (and the dropped ones to `out_dir/dropped/`); return the
    report: rows_in, rows_out, dropped by reason, the stage's counts, seconds and MB/s. Every row
    dropped is a `DataError` naming the reasons and `fix`, raised before anything is published."""
    started = time.perf_counter()
    table = MappedTable(in_dir).table
    n = table.num_rows
    dropped: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    text, origin = table.column(0), origin_column(table)
    at = 0
    with DatasetWriter(out_dir, TEXT_SCHEMA, max_shard_size) as kept:
        spill = DatasetWriter(out_dir / DROPPED_DIR, DROPPED_SCHEMA, max_shard_size) if keep_dropped else None
        try:
            for v in verdicts:
                if v.lo != at or v.hi - v.lo != len(v.reasons):
                    raise AssertionError(f"{stage}: verdicts for rows [{v.lo}, {v.hi}) after row {at}")
                at = v.hi
                counts.update(v.counts)
                gone = np.fromiter((r is not None for r in v.reasons), dtype=bool, count=len(v.reasons))
                part = text.slice(v.lo, v.hi - v.lo).combine_chunks()
                where = origin.slice(v.lo, v.hi - v.lo).combine_chunks()
                kept.write(text_batch(part, where).filter(pa.array(~gone)))
                if gone.any():
                    idx = np.flatnonzero(gone)
                    reasons = [v.reasons[i] for i in idx]
                    dropped.update(r for r in reasons if r is not None)
                    if spill is not None:
                        details = [v.details[i] for i in idx] if v.details else [None] * len(idx)
                        spill.write(
                            pa.record_batch(
                                [
                                    pa.array(idx + v.lo, type=pa.int64()),
                                    pa.array(reasons, type=pa.string()),
                                    pa.array(details, type=pa.string()),
                                    part.take(pa.array(idx)),
                                    where.take(pa.array(idx)),
                                ],
                                schema=DROPPED_SCHEMA,
                            )
                        )
                if on_progress is not None and n:
                    on_progress(at / n)
            if at != n:
                raise AssertionError(f"{stage}: verdicts end at row {at} of {n}")
            if kept.rows == 0 and n:
                reasons_text = ", ".join(f"{r}: {c:,}" for r, c in dropped.most_common())
                raise DataError(f"{stage}: every one of {n:,} rows was dropped ({reasons_text}); {fix}")
            rows_out = kept.finish()
            copy_origin_files(in_dir, out_dir)
            if spill is not None:
                spill.finish()
        finally:
            if spill is not None:
                spill._close()
    return {
        "rows_in": n,
        "rows_out": rows_out,
        "dropped": dict(dropped.most_common()),
        **({"counts": dict(counts)} if counts else {}),
        **timing(float(text_bytes(table).sum()) / 1e6, started),
        **({"dropped_rows": DROPPED_DIR} if keep_dropped else {}),  # relative to the published folder
    }


def judged_stage(ctx, out: Path, stage: str, judge: Judge, params: Any, *, fix: str) -> dict[str, Any]:
    """The build of a stage that judges rows one batch at a time (quality, language, decontaminate):
    its input is the chain's stage before it, judged in the plan's processes; returns the report."""
    from moai.stages.chain import before

    started = time.perf_counter()
    in_dir = ctx.path(before(ctx.config, stage))
    result = apply_verdicts(
        in_dir,
        out,
        judge_rows(in_dir, judge, params, num_proc=processes(ctx.plan)),
        stage=stage,
        keep_dropped=ctx.config.keep_dropped,
        max_shard_size=ctx.config.save.max_shard_size,
        fix=fix,
        on_progress=ctx.on_progress,
    )
    return {**result, **timing(result["mb_in"], started)}


# --- computing verdicts in worker processes ---------------------------------------------------

_worker: dict[str, Any] = {}


def _init(judge: Judge, params: Any, in_dir: str) -> None:
    _worker.update(judge=judge, params=params, text=MappedTable(in_dir).table.column(0), in_dir=in_dir)


def _judge_range(lo: int, hi: int) -> Verdicts:
    texts = _worker["text"].slice(lo, hi - lo).combine_chunks()
    reasons, details, counts = _worker["judge"](texts, _worker["params"])
    return Verdicts(lo, hi, reasons, details, counts)


def judge_rows(
    in_dir: Path, judge: Judge, params: Any, *, num_proc: int, rows_per_task: int = 2_000
) -> Iterator[Verdicts]:
    """The verdicts of `judge` over every row of `in_dir`, in order; in `num_proc` spawned workers
    when there is more than one task's worth of rows per process, else in this process."""
    table = MappedTable(in_dir).table
    n = table.num_rows
    num_proc = min(num_proc, max(1, int(text_bytes(table).sum()) // MIN_BYTES_PER_WORKER))
    ranges = [(lo, min(n, lo + rows_per_task)) for lo in range(0, n, rows_per_task)]
    if num_proc <= 1 or len(ranges) < 2 * num_proc:
        _init(judge, params, str(in_dir))
        try:
            for lo, hi in ranges:
                yield _judge_range(lo, hi)
        finally:
            _worker.clear()
        return
    # workers start with SIGINT left to this process (Ctrl-C: one line, see moai.workers)
    with spawn_pool(num_proc, _init, (judge, params, str(in_dir))) as pool:
        window: list[Future[Verdicts]] = []
        todo = iter(ranges)
        for lo, hi in todo:
            window.append(pool.submit(_judge_range, lo, hi))
            if len(window) >= 3 * num_proc:
                break
        while window:
            done = window.pop(0).result()
            nxt = next(todo, None)
            if nxt is not None:
                window.append(pool.submit(_judge_range, *nxt))
            yield done


# Below this much text per worker a spawned worker's start-up (~1-3 s of imports) costs more than it saves.
MIN_BYTES_PER_WORKER = 32_000_000


def processes(plan, text_bytes: int | None = None) -> int:
    """Worker processes for a cleaning stage: every core the plan gives tokenize (processes × threads),
    since the rules are Python, one core per process; fewer when there is too little text for them."""
    cores = max(1, plan.num_proc.value * plan.threads_per_proc.value)
    if text_bytes is None:
        return cores
    return max(1, min(cores, text_bytes // MIN_BYTES_PER_WORKER))
