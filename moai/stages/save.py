"""save: publish the clean text as a sharded `save_to_disk` DatasetDict with train/validation.

Validation rows are a seeded random choice of `round(val_fraction · rows)` rows (at least one
when val_fraction > 0); both splits keep the corpus order. The rows are streamed from the
memory-mapped input into the two splits' shards (`DatasetWriter`): no `datasets` call writes
caches next to the published input, and memory stays flat.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from moai.config import PipelineConfig, SplitConfig
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
from moai.stages.chain import before

NAME = "save"
VERSION = 2  # 2: keeps the origin column and origins.json (`moai.formats.text`)


def reads(config: PipelineConfig) -> tuple[str, ...]:
    """filter, or the last cleaning stage that is on (`moai.stages.chain`)."""
    return (before(config, NAME),)


def settings(config: PipelineConfig) -> dict[str, Any]:
    return {**config.split.model_dump(), "max_shard_size": config.save.max_shard_size}


def build(ctx, out: Path) -> dict[str, Any]:
    from moai.stages.tokenize import reference

    in_dir = ctx.path(before(ctx.config, NAME))
    # transformers' process (if one runs) samples what this writes for the tokenize check, meanwhile
    reference.sample_ahead(ctx.key, in_dir, ctx.config.split)
    return save(ctx.config.split, in_dir, out, max_shard_size=ctx.config.save.max_shard_size)


def num_validation_rows(num_rows: int, cfg: SplitConfig) -> int:
    """How many of `num_rows` rows go to validation (at least one when val_fraction > 0, never all)."""
    if cfg.val_fraction == 0 or num_rows < 2:
        return 0
    return min(num_rows - 1, max(1, round(num_rows * cfg.val_fraction)))


def validation_rows(num_rows: int, cfg: SplitConfig) -> np.ndarray:
    """Sorted indices of the validation rows: a pure function of (num_rows, val_fraction, seed)."""
    n_val = num_validation_rows(num_rows, cfg)
    if n_val == 0:
        return np.empty(0, dtype=np.int64)
    rng = np.random.default_rng(cfg.seed)
    return np.sort(rng.choice(num_rows, size=n_val, replace=False)).astype(np.int64)


def save(
    cfg: SplitConfig, in_dir: Path, out_dir: Path, *, max_shard_size: str, batch_rows: int = 1000
) -> dict[str, Any]:
    """Stream the input's rows into the train and validation splits (the validation rows by
    `validation_rows`), batch by batch: memory stays flat whatever the corpus size."""
    import json

    import pyarrow as pa

    started = time.perf_counter()
    mapped = MappedTable(in_dir)
    table = mapped.table
    n = table.num_rows
    if n == 0:
        raise DataError(f"{in_dir}: no rows to save")
    origin = origin_column(table)
    is_val = np.zeros(n, dtype=bool)
    is_val[validation_rows(n, cfg)] = True
    with (
        DatasetWriter(out_dir / "train", TEXT_SCHEMA, max_shard_size) as train,
        DatasetWriter(out_dir / "validation", TEXT_SCHEMA, max_shard_size) as validation,
    ):
        for lo in range(0, n, batch_rows):
            text = table.column(0).slice(lo, min(batch_rows, n - lo)).combine_chunks()
            rows = text_batch(text, origin.slice(lo, len(text)).combine_chunks())
            val = is_val[lo : lo + len(text)]
            train.write(rows.filter(pa.array(~val)))
            if val.any():
                validation.write(rows.filter(pa.array(val)))
            mapped.release()  # text already copied out: keep resident memory flat over the corpus
        splits = {"train": train.finish(), "validation": validation.finish()}
    (out_dir / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    copy_origin_files(in_dir, out_dir)
    return {
        "rows_in": n,
        "rows_out": n,
        "splits": splits,
        **timing(float(text_bytes(table).sum()) / 1e6, started),
    }
