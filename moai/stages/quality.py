"""quality: drop documents that fail heuristic quality rules (Gopher, C4, FineWeb; `moai.clean.quality`).

The rules run in the hardware plan's processes over ranges of rows. A dropped row's reason is
the first rule it fails (`gopher:word_count`, `c4:lorem_ipsum`, ...). With `quality.code: skip`
(the default) documents that look like code are not judged by prose rules; the report counts them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from moai.clean.rows import apply_verdicts, judge_rows, processes, text_column
from moai.config import PipelineConfig, QualityConfig
from moai.stages.chain import before, on

NAME = "quality"
VERSION = 1


def enabled(config: PipelineConfig) -> bool:
    return on(config, NAME)


def reads(config: PipelineConfig) -> tuple[str, ...]:
    return (before(config, NAME),)


def settings(config: PipelineConfig) -> dict[str, Any]:
    from moai.clean import quality as rules_mod

    cfg = config.quality
    assert cfg is not None
    rules = rules_mod.resolve(cfg)  # an unknown rule or threshold is a ConfigError before any stage runs
    return {"rules": [rules_mod.describe(r) for r in rules], "code": cfg.code, "keep_dropped": config.keep_dropped}


def judge(texts: pa.Array, params: tuple[list, str]) -> tuple[list[str | None], None, dict[str, int]]:
    from moai.clean import quality as rules_mod

    rules, code = params
    found = rules_mod.judge(text_column(texts), rules, code=code)
    return list(found.reasons), None, {"code_skipped": found.code_skipped}


def build(ctx, out: Path) -> dict[str, Any]:
    from moai.clean import quality as rules_mod

    cfg: QualityConfig = ctx.config.quality
    started = time.perf_counter()
    in_dir = ctx.path(before(ctx.config, NAME))
    result = apply_verdicts(
        in_dir,
        out,
        judge_rows(in_dir, judge, (rules_mod.resolve(cfg), cfg.code), num_proc=processes(ctx.plan)),
        stage=NAME,
        keep_dropped=ctx.config.keep_dropped,
        max_shard_size=ctx.config.save.max_shard_size,
        fix="relax quality.thresholds for the rules named, or choose other quality.rules",
        on_progress=ctx.on_progress,
    )
    seconds = time.perf_counter() - started
    return {
        **result,
        "seconds": round(seconds, 3),
        "mb_per_s": round(result["mb_in"] / seconds, 2) if seconds else None,
    }
