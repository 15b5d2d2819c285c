"""save: publish the clean text as a sharded `save_to_disk` DatasetDict with train/validation.

Validation rows are a seeded random choice of `round(val_fraction · rows)` rows (at least one
when val_fraction > 0); both splits keep the corpus order. Selecting with an in-memory index
(8 bytes a row) keeps `datasets` from writing index caches next to the published input.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from moai.config import PipelineConfig, SplitConfig
from moai.errors import DataError
from moai.formats.text import open_text, text_bytes
from moai.report import timing
from moai.stages.chain import before

NAME = "save"
VERSION = 1


def reads(config: PipelineConfig) -> tuple[str, ...]:
    """filter, or the last cleaning stage that is on (`moai.stages.chain`)."""
    return (before(config, NAME),)


def settings(config: PipelineConfig) -> dict[str, Any]:
    return {**config.split.model_dump(), "max_shard_size": config.save.max_shard_size}


def build(ctx, out: Path) -> dict[str, Any]:
    return save(
        ctx.config.split, ctx.path(before(ctx.config, NAME)), out, max_shard_size=ctx.config.save.max_shard_size
    )


def validation_rows(num_rows: int, cfg: SplitConfig) -> np.ndarray:
    """Sorted indices of the validation rows: a pure function of (num_rows, val_fraction, seed)."""
    if cfg.val_fraction == 0 or num_rows < 2:
        return np.empty(0, dtype=np.int64)
    n_val = min(num_rows - 1, max(1, round(num_rows * cfg.val_fraction)))
    rng = np.random.default_rng(cfg.seed)
    return np.sort(rng.choice(num_rows, size=n_val, replace=False)).astype(np.int64)


def save(cfg: SplitConfig, in_dir: Path, out_dir: Path, *, max_shard_size: str) -> dict[str, Any]:
    import datasets

    started = time.perf_counter()
    ds = open_text(in_dir)
    n = ds.num_rows
    if n == 0:
        raise DataError(f"{in_dir}: no rows to save")
    val = validation_rows(n, cfg)
    mask = np.ones(n, dtype=bool)
    mask[val] = False
    train_idx = np.flatnonzero(mask)
    splits = {"train": ds.select(train_idx, keep_in_memory=True) if len(val) else ds}
    if len(val):
        splits["validation"] = ds.select(val, keep_in_memory=True)
    else:
        splits["validation"] = ds.select([], keep_in_memory=True)
    datasets.DatasetDict(splits).save_to_disk(str(out_dir), max_shard_size=max_shard_size)
    return {
        "rows_in": n,
        "rows_out": n,
        "splits": {name: split.num_rows for name, split in splits.items()},
        **timing(float(text_bytes(ds.data.table).sum()) / 1e6, started),
    }
