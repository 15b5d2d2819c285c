"""decontaminate: drop documents that share a word n-gram with an evaluation text.

The evaluation files (`decontaminate.path`, any format convert reads; the text in `text_field`,
one or several fields, each its own evaluation text) are read once. Every word `ngram`-gram of
every evaluation text goes into a sorted array of hashes (`moai.clean.ngrams`: NFKC, lower case,
punctuation removed, so case and punctuation changes do not hide a leak). An evaluation text
shorter than `ngram` words but of at least `MIN_WORDS` is matched whole (its own length's
n-gram); shorter ones would match ordinary prose and are left out and counted. A document is
`contaminated` when any of its n-grams is in the array (detail: the evaluation file and line).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from moai.clean.ngrams import ngram_hashes, normalised_words, word_hashes
from moai.clean.rows import judged_stage
from moai.config import DecontaminateConfig, PipelineConfig, SourceConfig
from moai.errors import DataError
from moai.stages.chain import declare

log = logging.getLogger(__name__)

NAME = "decontaminate"
VERSION = 2  # 2: kept and dropped rows keep their origin (`moai.formats.text`)
MIN_WORDS = 5
enabled, reads = declare(NAME)


def _fields(cfg: DecontaminateConfig) -> list[str]:
    return [cfg.text_field] if isinstance(cfg.text_field, str) else list(cfg.text_field)


def _source(cfg: DecontaminateConfig, field: str) -> SourceConfig:
    return SourceConfig(path=cfg.path, text_field=field)


def settings(config: PipelineConfig) -> dict[str, Any]:
    from moai.stages.convert import source_fingerprint

    cfg = config.decontaminate
    assert cfg is not None
    try:
        evals = source_fingerprint(_source(cfg, _fields(cfg)[0]))
    except DataError as err:  # it names source.path: here the setting is decontaminate.path
        raise DataError(str(err).replace("source.path", "decontaminate.path", 1)) from None
    if not eval_texts(cfg, evals):  # read now (cached): a missing field fails before any stage runs
        raise DataError(f"decontaminate.path {cfg.path!r}: no evaluation text in field(s) {_fields(cfg)}")
    return {
        **cfg.model_dump(exclude={"path"}),
        "evals": evals,
        "min_words": MIN_WORDS,
        "keep_dropped": config.keep_dropped,
    }


_READ: dict[tuple[str, tuple[str, ...]], list[tuple[str, str]]] = {}  # (evals fingerprint, fields) → texts


def eval_texts(cfg: DecontaminateConfig, fingerprint: str | None = None) -> list[tuple[str, str]]:
    """(where, text) of every evaluation text: `file:line` and the text of each field. With the
    files' fingerprint, read once per process for it."""
    fields = _fields(cfg)
    if fingerprint is None:
        return _read_evals(cfg, fields)
    key = (fingerprint, tuple(fields))
    if key not in _READ:
        _READ[key] = _read_evals(cfg, fields)
    return _READ[key]


def _read_evals(cfg: DecontaminateConfig, fields: list[str]) -> list[tuple[str, str]]:
    from moai.stages.convert.readers import Rows, file_rows, source_files

    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    try:
        paths = source_files(_source(cfg, fields[0]))
    except DataError as err:
        raise DataError(str(err).replace("source.path", "decontaminate.path", 1)) from None
    for path in paths:
        rows = Rows(_source(cfg, fields[0]))
        for where, row in file_rows(path, rows.source, rows, []):
            missing = [f for f in fields if f not in row]
            if len(missing) == len(fields):
                raise DataError(
                    f"{where}: no field {' or '.join(map(repr, fields))} (decontaminate.text_field); "
                    f"fields here: {sorted(row)}"
                )
            seen.update(f for f in fields if f in row)
            for f in fields:
                value = row.get(f)
                if isinstance(value, str) and value.strip():
                    out.append((where, value))
                elif isinstance(value, list):  # e.g. a list of answer choices: each is a text
                    out.extend((where, v) for v in value if isinstance(v, str) and v.strip())
    never = [f for f in fields if f not in seen]
    if never and out:
        raise DataError(
            f"decontaminate.text_field {never[0]!r}: no row of decontaminate.path {cfg.path!r} has it "
            f"(fields found: {sorted(seen)}); remove it from the list or fix its name"
        )
    return out


class EvalIndex:
    """Sorted n-gram hashes of the evaluation texts, by n-gram length, with the text each came from."""

    def __init__(self, texts: list[tuple[str, str]], ngram: int):
        self.ngram = ngram
        self.where = [w for w, _ in texts]
        words = normalised_words(pa.array([t for _, t in texts], type=pa.string()))
        w, offsets = word_hashes(words)
        counts = np.diff(offsets)
        self.too_short = int(np.count_nonzero(counts < MIN_WORDS))
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for length in sorted({int(c) for c in counts if MIN_WORDS <= c < ngram} | {ngram}):
            pick = counts >= ngram if length == ngram else counts == length
            if not pick.any():
                continue
            ng = ngram_hashes(w, offsets, length, short=False)
            item = np.repeat(np.arange(len(counts)), ng.counts())
            keep = pick[item]
            hashes, items = ng.hashes[keep], item[keep]
            order = np.argsort(hashes, kind="stable")
            self.tables[length] = (hashes[order], items[order])
        self.items = len(texts)
        self.ngrams = sum(len(h) for h, _ in self.tables.values())


def judge(texts: pa.Array, index: EvalIndex) -> tuple[list[str | None], list[str | None], dict[str, int]]:
    w, offsets = word_hashes(normalised_words(texts))
    n = len(offsets) - 1
    hit = np.full(n, -1, dtype=np.int64)
    for length, (hashes, items) in index.tables.items():
        if not len(hashes):
            continue
        ng = ngram_hashes(w, offsets, length, short=False)
        if not len(ng.hashes):
            continue
        at = np.searchsorted(hashes, ng.hashes)
        at[at == len(hashes)] = 0
        found = hashes[at] == ng.hashes
        if not found.any():
            continue
        doc = np.repeat(np.arange(n), ng.counts())
        for d, item in zip(doc[found], items[at[found]], strict=True):
            if hit[d] < 0:
                hit[d] = item
    reasons: list[str | None] = [None if h < 0 else "contaminated" for h in hit]
    details: list[str | None] = [None if h < 0 else f"shares a {index.ngram}-gram with {index.where[h]}" for h in hit]
    return reasons, details, {}


def params(config: PipelineConfig) -> EvalIndex:
    """What `judge` judges with: the n-gram index of the evaluation texts (read once per process)."""
    cfg = config.decontaminate
    assert cfg is not None
    texts = eval_texts(cfg, settings(config)["evals"])
    if not texts:
        raise DataError(f"decontaminate.path {cfg.path!r}: no evaluation text in field(s) {_fields(cfg)}")
    return EvalIndex(texts, cfg.ngram)


def build(ctx, out: Path) -> dict[str, Any]:
    cfg: DecontaminateConfig = ctx.config.decontaminate
    index = params(ctx.config)
    log.info(
        "decontaminate: %d evaluation texts, %d n-grams (%d shorter than %d words left out)",
        index.items,
        index.ngrams,
        index.too_short,
        MIN_WORDS,
    )
    report = judged_stage(
        ctx,
        out,
        NAME,
        judge,
        index,
        fix=f"check decontaminate.path {cfg.path!r} and raise decontaminate.ngram ({cfg.ngram})",
    )
    return {
        **report,
        "eval_texts": index.items,
        "eval_ngrams": index.ngrams,
        "eval_texts_too_short": index.too_short,
    }
