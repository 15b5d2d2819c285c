"""quality: drop documents that fail heuristic quality rules (Gopher, C4, FineWeb; `moai.clean.quality`).

The rules run in the hardware plan's processes over ranges of rows. A dropped row's reason is
the first rule it fails (`gopher:word_count`, `c4:lorem_ipsum`, ...). With `quality.code: skip`
(the default) documents that are code (code files, instruction + solution records;
`moai.clean.code`) are not judged by prose rules; the report counts them (`counts.code_exempt`,
shown in the stage table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from moai.clean.rows import judged_stage
from moai.config import PipelineConfig, QualityConfig
from moai.formats.text import text_list
from moai.stages.chain import declare

NAME = "quality"
# 2: code detection finds records that carry code (moai.clean.code); count code_exempt
# 3: kept and dropped rows keep their origin (`moai.formats.text`)
VERSION = 3
enabled, reads = declare(NAME)


def settings(config: PipelineConfig) -> dict[str, Any]:
    from moai.clean import quality as rules_mod

    cfg = config.quality
    assert cfg is not None
    rules = rules_mod.resolve(cfg)  # an unknown rule or threshold is a ConfigError before any stage runs
    return {"rules": [rules_mod.describe(r) for r in rules], "code": cfg.code, "keep_dropped": config.keep_dropped}


def judge(texts: pa.Array, params: tuple[list, str]) -> tuple[list[str | None], None, dict[str, int]]:
    from moai.clean import quality as rules_mod

    rules, code = params
    found = rules_mod.judge(text_list(texts), rules, code=code)
    return list(found.reasons), None, {"code_exempt": found.code_exempt}


def params(config: PipelineConfig) -> tuple[list, str]:
    """What `judge` judges with: the rules and what to do with code."""
    from moai.clean import quality as rules_mod

    cfg: QualityConfig | None = config.quality
    assert cfg is not None
    return rules_mod.resolve(cfg), cfg.code


def build(ctx, out: Path) -> dict[str, Any]:
    return judged_stage(
        ctx,
        out,
        NAME,
        judge,
        params(ctx.config),
        fix="relax quality.thresholds for the rules named, or choose other quality.rules",
    )
