"""filter: drop rows by rule and count each reason.

Rules (in this order, first match names the reason): `empty` (nothing but whitespace),
`too_short` (fewer than `min_chars` characters after stripping), `too_long` (over `max_chars`).
The masks are computed with Arrow kernels over record batches of the memory-mapped input, so
memory stays flat and no Python loop runs per row.

Filtering out every row is an error naming the counts and settings, raised before anything is
published. So is an input without rows: convert no longer publishes one, but an older moai did,
and `datasets` fails to open it with a bare `IndexError`.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

from moai.config import FilterConfig, PipelineConfig
from moai.errors import DataError
from moai.formats.text import (
    TEXT_SCHEMA,
    MappedTable,
    copy_origin_files,
    filled,
    text_batch,
    text_batches,
    text_bytes,
    write_text_dataset,
)
from moai.report import timing

NAME = "filter"
VERSION = 2  # 2: keeps the origin column and origins.json (`moai.formats.text`)
READS = ("convert",)


def settings(config: PipelineConfig) -> dict[str, Any]:
    return config.filter.model_dump()


def build(ctx, out: Path) -> dict[str, Any]:
    from moai.stages.tokenize import reference

    # transformers' process (if one runs) encodes what the tokenize check will likely sample, meanwhile
    reference.candidates_ahead(ctx.path("convert"))
    return filter_text(
        ctx.config.filter,
        ctx.path("convert"),
        out,
        batch_size=ctx.plan.writer_batch_size.value,
        max_shard_size=ctx.config.save.max_shard_size,
    )


# What to change when every row was dropped, by the reasons that dropped them.
_FIXES = {
    "too_short": "lower filter.min_chars",
    "too_long": "raise filter.max_chars",
    "empty": "check that source.text_field/text_template picks the text",
}


def reason_masks(cfg: FilterConfig, texts):
    """(empty, too_short, too_long) boolean masks of a text array: each row in at most one, the
    first rule that matches (`moai.trace` asks this of one row to say why it was dropped)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = filled(texts)
    length = pc.utf8_length(pc.utf8_trim_whitespace(text))
    empty = pc.equal(length, 0)
    short = pc.and_(pc.invert(empty), pc.less(length, cfg.min_chars))
    long = pc.greater(length, cfg.max_chars) if cfg.max_chars else pa.array([False] * len(text))
    long = pc.and_(long, pc.invert(pc.or_(empty, short)))
    return empty, short, long


def filter_text(
    cfg: FilterConfig, in_dir: Path, out_dir: Path, *, batch_size: int, max_shard_size: str
) -> dict[str, Any]:
    import pyarrow.compute as pc

    started = time.perf_counter()
    if not json.loads((in_dir / "state.json").read_text())["_data_files"]:
        raise DataError(
            f"filter: the convert output {in_dir} holds 0 documents (an earlier moai published empty outputs); "
            f"remove it (rm -rf {shlex.quote(str(in_dir))}) and rerun: convert will say why the source gives none"
        )
    mapped = MappedTable(in_dir)
    table = mapped.table
    dropped = {"empty": 0, "too_short": 0, "too_long": 0}

    def kept():
        for read in text_batches(table, batch_size):
            # a text folder of an older moai has no origin column: its origins are unknown
            batch = read if read.schema.equals(TEXT_SCHEMA) else text_batch(read.column(0))
            empty, short, long = reason_masks(cfg, batch.column(0))
            dropped["empty"] += pc.sum(empty).as_py() or 0
            dropped["too_short"] += pc.sum(short).as_py() or 0
            dropped["too_long"] += pc.sum(long).as_py() or 0
            keep = pc.invert(pc.or_(pc.or_(empty, short), long))
            yield batch.filter(keep)
            mapped.release()  # written: keep resident memory flat over the corpus

    rows_out = write_text_dataset(kept(), out_dir, max_shard_size)
    copy_origin_files(in_dir, out_dir)
    if rows_out == 0:
        counts = ", ".join(f"{reason}: {n}" for reason, n in dropped.items() if n)
        fixes = [fix for reason, fix in _FIXES.items() if dropped[reason]]
        raise DataError(
            f"filter: every one of {table.num_rows} rows was filtered out ({counts}) with "
            f"filter.min_chars={cfg.min_chars}, filter.max_chars={cfg.max_chars}; {' or '.join(fixes)}"
        )
    return {
        "rows_in": table.num_rows,
        "rows_out": rows_out,
        "dropped": {k: v for k, v in dropped.items() if v},
        **timing(float(text_bytes(table).sum()) / 1e6, started),
    }
