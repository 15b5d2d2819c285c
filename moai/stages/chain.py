"""The text stages between filter and save, in order; each cleaning stage is on when its config
block is given. A stage reads the last stage before it that is on, and save reads the last one,
so a config without cleaning blocks has the keys it always had (save reads filter)."""

from __future__ import annotations

from collections.abc import Callable

from moai.config import PipelineConfig

CHAIN: tuple[tuple[str, Callable[[PipelineConfig], bool]], ...] = (
    ("filter", lambda config: True),
    ("dedup", lambda config: config.dedup is not None),
    ("quality", lambda config: config.quality is not None),
    ("language", lambda config: config.language is not None),
    ("decontaminate", lambda config: config.decontaminate is not None),
)


def on(config: PipelineConfig, name: str) -> bool:
    return dict(CHAIN)[name](config)


def before(config: PipelineConfig, name: str) -> str:
    """The text stage `name` reads: the last stage of the chain before it that is on (`save`: the last)."""
    names = [n for n, _ in CHAIN]
    upto = names.index(name) if name in names else len(names)
    return [n for n, is_on in CHAIN[:upto] if is_on(config)][-1]


def declare(name: str) -> tuple[Callable[[PipelineConfig], bool], Callable[[PipelineConfig], tuple[str, ...]]]:
    """A cleaning stage's `enabled` and `reads` (moai.pipeline): on with its block, reading the
    stage of the chain before it."""
    return (lambda config: on(config, name)), (lambda config: (before(config, name),))


def judge_sample(config: PipelineConfig, texts: list[str]) -> tuple[list[str], dict[str, int]]:
    """The texts the cleaning stages that are on keep, in order, and how many each drops: each
    stage's own verdicts (`judge`, dedup's `judge_texts`) on these texts alone, as filter left
    them (`moai.estimate`: plan's sample of a source)."""
    from importlib import import_module

    import pyarrow as pa

    dropped: dict[str, int] = {}
    for name, is_on in CHAIN[1:]:
        if not is_on(config) or not texts:
            continue
        stage, column = import_module(f"moai.stages.{name}"), pa.array(texts, type=pa.string())
        if name == "dedup":
            reasons = stage.judge_texts(config.dedup, column)
        else:
            reasons = stage.judge(column, stage.params(config))[0]
        dropped[name] = sum(r is not None for r in reasons)
        texts = [t for t, r in zip(texts, reasons, strict=True) if r is None]
    return texts, dropped
