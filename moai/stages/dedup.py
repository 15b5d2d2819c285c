"""dedup: drop exact copies, then near-duplicates, keeping the first copy of each.

Reads its text and the `signatures` of it; with several sources, also the text and signatures of
every source before it in config order. Documents are numbered in that order (earlier sources
first, then this source's rows), and of every set of copies the first is kept:

- exact: a row whose normalised-text key (`moai.clean.minhash.exact_keys`) appeared before is
  dropped as `exact_duplicate` (detail: the kept row, `row 12` or `ko row 12`);
- near: the rows left (over all sources up to this one) are clustered by MinHash LSH, candidate
  pairs checked by exact Jaccard when `near.verify`; a row that is not the first of its cluster
  is dropped as `near_duplicate` (detail: its cluster's first row and, verified, the Jaccard).

Clusters are transitive (A~B and B~C put A, B and C together). The earlier sources' own rows are
never dropped here: their own dedup nodes decided them, with the sources before them.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from moai.clean.minhash import cluster, exact_keys, first_copies, jaccard_sorted
from moai.clean.rows import Verdicts, apply_verdicts
from moai.clean.shingles import shingles
from moai.config import DedupConfig, PipelineConfig
from moai.formats.text import MappedTable
from moai.report import timing
from moai.stages.chain import before, on
from moai.stages.signatures import NAME as SIGNATURES, hasher

log = logging.getLogger(__name__)

NAME = "dedup"
VERSION = 2  # 2: kept and dropped rows keep their origin (`moai.formats.text`)
READS_EARLIER = ("filter", SIGNATURES)  # dedup is the first stage after filter (moai.stages.chain)


def enabled(config: PipelineConfig) -> bool:
    return on(config, NAME)


def reads(config: PipelineConfig) -> tuple[str, ...]:
    return (before(config, NAME), SIGNATURES)  # and, with several sources, READS_EARLIER of the earlier ones


def settings(config: PipelineConfig) -> dict[str, Any]:
    assert config.dedup is not None
    return {**config.dedup.model_dump(), "keep_dropped": config.keep_dropped}


class _Texts:
    """Random access to the texts of several sources by global document id, with an LRU of n-gram sets."""

    def __init__(self, tables: list, names: list[str | None], ngram: int):
        self.tables = tables  # each source's text column (Arrow)
        self.names = names
        self.starts = np.cumsum([0] + [len(t) for t in self.tables])
        self.ngram = ngram
        self.cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.limit = 20_000

    def where(self, gid: int) -> tuple[int, int]:
        s = int(np.searchsorted(self.starts, gid, side="right")) - 1
        return s, gid - int(self.starts[s])

    def label(self, gid: int) -> str:
        s, row = self.where(gid)
        name = self.names[s]
        return f"row {row}" if name is None else f"{name} row {row}"

    def prefetch(self, gids: list[int]) -> None:
        """Compute the n-gram sets of `gids` not cached, in one batch (the Arrow kernels' cost is per call)."""
        todo = [g for g in gids if g not in self.cache]
        if not todo:
            return
        texts = []
        for g in todo:
            s, row = self.where(g)
            texts.append(self.tables[s][row].as_py() or "")
        ng = shingles(texts, self.ngram)
        for i, g in enumerate(todo):
            self.cache[g] = np.unique(ng.hashes[ng.offsets[i] : ng.offsets[i + 1]])
        while len(self.cache) > max(self.limit, 2 * len(gids)):
            self.cache.popitem(last=False)

    def ngrams(self, gid: int) -> np.ndarray:
        """The sorted distinct n-gram hashes of document `gid`."""
        got = self.cache.get(gid)
        if got is None:
            s, row = self.where(gid)
            got = np.unique(shingles([self.tables[s][row].as_py() or ""], self.ngram).hashes)
            self.cache[gid] = got
            if len(self.cache) > self.limit:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(gid)
        return got


@dataclass
class Decisions:
    """Of the last `len(reasons)` documents: 0 kept, 1 exact copy, 2 near copy; the kept copy's global
    id; the Jaccard of a verified near copy with it (NaN otherwise); the near clustering's report."""

    reasons: np.ndarray
    other: np.ndarray
    similarity: np.ndarray
    near: dict[str, Any] | None


REASONS = (None, "exact_duplicate", "near_duplicate")


def decide(
    cfg: DedupConfig, keys: np.ndarray | None, bands: np.ndarray | None, texts: _Texts, offset: int
) -> Decisions:
    """Which of the documents from global id `offset` on are copies of an earlier one, given every
    document's exact keys (with `dedup.exact`) and MinHash bands (with `dedup.near`), and their texts."""
    total = int(texts.starts[-1])
    n = total - offset
    reasons = np.zeros(n, dtype=np.int8)
    other = np.full(n, -1, dtype=np.int64)  # the kept copy's global id
    similarity = np.full(n, np.nan)
    alive = np.ones(total, dtype=bool)
    if cfg.exact:
        assert keys is not None
        first = first_copies(keys)
        alive = first == np.arange(total)
        mine = ~alive[offset:]
        reasons[mine] = 1
        other[mine] = first[offset:][mine]
    mh = hasher(cfg)
    if mh is None or cfg.near is None:
        return Decisions(reasons, other, similarity, None)
    assert bands is not None
    threshold = cfg.near.threshold
    measured: dict[tuple[int, int], float] = {}  # (earlier, later) → Jaccard of their n-gram sets

    def verify(x: int, y: int) -> bool:
        sim = jaccard_sorted(texts.ngrams(x), texts.ngrams(y))
        measured[(x, y)] = sim
        return sim >= threshold

    root, stats = cluster(bands, alive, verify=verify if cfg.near.verify else None, prefetch=texts.prefetch)
    mine_root = root[offset:]
    near = (mine_root >= 0) & (mine_root != np.arange(offset, total)) & (reasons == 0)
    reasons[near] = 2
    other[near] = mine_root[near]
    if cfg.near.verify:  # the Jaccard of each dropped row with its cluster's first (mostly measured already)
        found = [i for i in np.flatnonzero(near) if (int(other[i]), offset + int(i)) not in measured]
        for lo in range(0, len(found), 5_000):
            part = found[lo : lo + 5_000]
            texts.prefetch(sorted({offset + int(i) for i in part} | {int(other[i]) for i in part}))
            for i in part:
                measured[(int(other[i]), offset + int(i))] = jaccard_sorted(
                    texts.ngrams(int(other[i])), texts.ngrams(offset + int(i))
                )
        for i in np.flatnonzero(near):
            similarity[i] = measured[(int(other[i]), offset + int(i))]
    report = {"bands": mh.bands, "rows": mh.rows, "threshold": threshold, "verify": cfg.near.verify, **stats}
    return Decisions(reasons, other, similarity, report)


def judge_texts(cfg: DedupConfig, texts: pa.Array) -> list[str | None]:
    """The verdict on each of these texts (None kept, else `exact_duplicate` / `near_duplicate`),
    deduplicated among themselves alone, as `build` decides them (plan's estimate, `moai.estimate`)."""
    mh = hasher(cfg)
    keys = exact_keys(texts) if cfg.exact else None
    bands = mh(texts) if mh is not None else None
    found = decide(cfg, keys, bands, _Texts([texts], [None], mh.ngram if mh else 1), 0)
    return [REASONS[r] for r in found.reasons]


def build(ctx, out: Path) -> dict[str, Any]:
    cfg = ctx.config.dedup
    started = time.perf_counter()
    text_dir = ctx.path(before(ctx.config, NAME))
    earlier_text = ctx.per_source("filter")
    earlier_sigs = ctx.per_source(SIGNATURES)
    names: list[str | None] = [*earlier_text, None]
    dirs = [*earlier_text.values(), text_dir]
    sig_dirs = [*(earlier_sigs[n] for n in earlier_text), ctx.path(SIGNATURES)]
    sizes = [MappedTable(d).table.num_rows for d in dirs]
    offset, n = sum(sizes[:-1]), sizes[-1]
    report: dict[str, Any] = {"kept_copy": "first: earlier source in config order, then earlier row"}
    mh = hasher(cfg)
    keys = np.concatenate([np.load(d / "exact.npy") for d in sig_dirs]) if cfg.exact else None
    bands = np.concatenate([np.load(d / "bands.npy") for d in sig_dirs]) if mh is not None else None
    texts = _Texts([MappedTable(d).table.column(0) for d in dirs], names, mh.ngram if mh else 1)
    found = decide(cfg, keys, bands, texts, offset)
    reasons, other, similarity = found.reasons, found.other, found.similarity
    if found.near is not None:
        report["near"] = found.near
    label = texts.label
    if offset:
        report["earlier_sources"] = {str(k): v for k, v in zip(names[:-1], sizes[:-1], strict=True)}

    def verdicts():
        step = 10_000
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            rs: list[str | None] = []
            ds: list[str | None] = []
            for i in range(lo, hi):
                r = reasons[i]
                rs.append(REASONS[r])
                if r == 0:
                    ds.append(None)
                elif r == 1:
                    ds.append(f"copy of {label(int(other[i]))}")
                else:
                    sim = "" if np.isnan(similarity[i]) else f" (Jaccard {similarity[i]:.3f})"
                    ds.append(f"near copy of {label(int(other[i]))}{sim}")
            yield Verdicts(lo, hi, rs, ds)

    result = apply_verdicts(
        text_dir,
        out,
        verdicts(),
        stage=NAME,
        keep_dropped=ctx.config.keep_dropped,
        max_shard_size=ctx.config.save.max_shard_size,
        fix="every document is a copy of an earlier one: check the source, or turn dedup off",
        on_progress=ctx.on_progress,
    )
    return {**result, **report, **timing(result["mb_in"], started)}
