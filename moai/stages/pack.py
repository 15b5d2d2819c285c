"""pack: a sample index of `seq_len` samples over the token store (see `moai.formats.tokens`).

`pack.mode: concat` (the default), concatenate-and-chunk: the split's documents, each ending in
EOS, form one stream cut into consecutive `seq_len` windows. Every token lands in exactly one
window, no padding is needed, and the cost is that documents crossing a window edge are split
(20–35% of them at 2k–4k for typical length distributions); `position_ids` restart at every document start so attention
never crosses a boundary. With `drop_remainder` the last, shorter window is left out and
reported. The index is a pure function of (document offsets, seq_len).

`pack.mode: best_fit`: documents are packed whole into rows by best-fit decreasing (`best_fit`);
only a document longer than seq_len is cut (into seq_len pieces and a tail). The rest of a row is
padding, with no loss and its own position_ids (nothing attends to it). On lognormal lengths
(median ~400 tokens) at seq_len 2048 padding is ~0.001% of 10M documents; the report gives
rows, padding_fraction and documents_split per split. Format 3 of the sample index.
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from moai.config import PackConfig, PipelineConfig
from moai.errors import DataError
from moai.formats.tokens import BEST_FIT_FORMAT, PACK_FORMAT, TokenStore

log = logging.getLogger(__name__)

NAME = "pack"
VERSION = 1
READS = ("tokenize",)


def enabled(config: PipelineConfig) -> bool:
    """On for one source; with several, the mix stage packs their token stores together."""
    return config.pack.enabled and config.sources is None


def settings(config: PipelineConfig) -> dict[str, Any]:
    return config.pack.model_dump(exclude={"enabled"})


def build(ctx, out: Path) -> dict[str, Any]:
    tokens = ctx.path("tokenize")
    # the sample index names its token store relative to the cache, so a moved cache still opens
    return pack(ctx.config.pack, tokens, out, store_ref=str(tokens.relative_to(ctx.store.root)))


def concat_chunk(num_tokens: int, seq_len: int, drop_remainder: bool) -> np.ndarray:
    """(num_samples, 2) int64 array of [start, length] windows over a stream of num_tokens."""
    full = num_tokens // seq_len
    starts = np.arange(full, dtype=np.int64) * seq_len
    samples = np.stack([starts, np.full(full, seq_len, dtype=np.int64)], axis=1)
    rest = num_tokens - full * seq_len
    if rest and not drop_remainder:
        samples = np.concatenate([samples, np.array([[full * seq_len, rest]], dtype=np.int64)])
    return samples.reshape(-1, 2)


def documents_split(doc_offsets: np.ndarray, seq_len: int) -> int:
    """How many documents cross a window edge (their tokens land in two or more samples)."""
    starts, ends = doc_offsets[:-1], doc_offsets[1:]
    return int(np.count_nonzero((starts // seq_len) != ((ends - 1) // seq_len)))


def length_histogram(lengths: np.ndarray, seq_len: int) -> list[dict[str, int | None]]:
    """Document lengths in tokens, binned by powers of two up to and beyond seq_len."""
    edges = [1]
    while edges[-1] < max(seq_len, 1) * 2:
        edges.append(edges[-1] * 2)
    counts, _ = np.histogram(lengths, bins=[*edges, np.iinfo(np.int64).max])
    return [
        {"from": lo, "to": hi - 1 if i < len(edges) - 1 else None, "documents": int(c)}
        for i, (lo, hi, c) in enumerate(zip(edges, [*edges[1:], 0], counts, strict=True))
    ]


def pack(cfg: PackConfig, store_dir: Path, out_dir: Path, *, store_ref: str) -> dict[str, Any]:
    """Write the sample index of every split; `store_ref` is the store's path relative to the cache dir."""
    started = time.perf_counter()
    store = TokenStore(store_dir)
    splits: dict[str, Any] = {}
    for name in store.splits:
        split = store.split(name)
        offsets = split.doc_offsets
        lengths = np.diff(offsets)
        if cfg.mode == "best_fit":
            samples, pieces = best_fit_rows(offsets, cfg.seq_len)
            np.save(out_dir / f"{name}.pieces.npy", pieces)
            used = int(samples[:, 3].sum()) if len(samples) else 0
            extra = best_fit_report(samples, offsets, cfg.seq_len)
        else:
            samples = concat_chunk(split.num_tokens, cfg.seq_len, cfg.drop_remainder)
            used = int(samples[:, 1].sum()) if len(samples) else 0
            extra = {"documents_split": documents_split(offsets, cfg.seq_len) if len(offsets) > 1 else 0}
        np.save(out_dir / f"{name}.npy", samples)
        splits[name] = {
            "samples": len(samples),
            "tokens": split.num_tokens,
            "tokens_used": used,
            "tokens_dropped": split.num_tokens - used,
            "fraction_used": round(used / split.num_tokens, 6) if split.num_tokens else 0.0,
            "documents": split.num_documents,
            **extra,
            "length_histogram": length_histogram(lengths, cfg.seq_len) if len(lengths) else [],
            "mean_document_tokens": round(float(lengths.mean()), 1) if len(lengths) else 0.0,
        }
    if splits.get("train", {}).get("samples", 0) == 0:
        raise DataError(
            f"the train split has {splits.get('train', {}).get('tokens', 0)} tokens, fewer than one "
            f"pack.seq_len={cfg.seq_len} window; lower pack.seq_len or add data"
        )
    meta: dict[str, Any] = {
        "format": PACK_FORMAT,
        "seq_len": cfg.seq_len,
        "mode": cfg.mode,
        "drop_remainder": cfg.drop_remainder,
        "token_store": store_ref,
        "splits": {k: v["samples"] for k, v in splits.items()},
    }
    if cfg.mode == "best_fit":
        meta = {
            "format": BEST_FIT_FORMAT,
            "seq_len": cfg.seq_len,
            "mode": cfg.mode,
            "order": "shuffle",
            "sources": [{"name": "default", "token_store": store_ref}],
            "splits": meta["splits"],
        }
    (out_dir / "pack.json").write_text(json.dumps(meta, indent=2))
    train = splits["train"]
    warnings = empty_validation(splits, cfg.seq_len)
    for w in warnings:
        log.warning(w)
    report = {
        "rows_in": sum(s["documents"] for s in splits.values()),
        "rows_out": sum(s["samples"] for s in splits.values()),
        "samples": {k: v["samples"] for k, v in splits.items()},
        "seq_len": cfg.seq_len,
        "mode": cfg.mode,
        "tokens": sum(s["tokens"] for s in splits.values()),
        "fraction_used": train["fraction_used"],
        "documents_split": train["documents_split"],
        "splits": splits,
        "warnings": warnings,
        "seconds": round(time.perf_counter() - started, 3),
    }
    if cfg.mode == "best_fit":
        report["padding_fraction"] = train["padding_fraction"]
    return report


def empty_validation(splits: dict[str, Any], seq_len: int) -> list[str]:
    """A validation split with documents but no window: training would silently evaluate nothing."""
    val = splits.get("validation")
    if not val or val["documents"] == 0 or val["samples"] > 0:
        return []
    return [
        f"the validation split has {val['documents']} document(s), {val['tokens']} tokens: fewer than one "
        f"pack.seq_len={seq_len} window, so 0 validation samples and training evaluates nothing; lower "
        "pack.seq_len, raise split.val_fraction or add data"
    ]


# -- best fit ---------------------------------------------------------------------------------------


def best_fit(doc_offsets: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents packed whole into rows of at most seq_len tokens by best-fit decreasing.

    A document longer than seq_len is first cut into seq_len pieces (each a row of its own) and
    a shorter tail; the tails and the short documents ("items") go, longest first, each into the
    open row whose free space is the smallest that holds it, or into a new row. Returns
    (pieces, row_offsets): pieces (m, 2) int64 [start token, length] in the split's stream, row by
    row (a row's pieces in the order placed), and row r = pieces[row_offsets[r]:row_offsets[r + 1]].

    Cost: O(n log n) for the sort, then work per distinct item length, not per item: items of one
    length are placed together, because the sequential rule puts consecutive equal items into the
    same row while it has room (its free space only shrinks, so it stays the best fit), which
    fills each chosen row with ⌊free / length⌋ of them at once. Rows with the same free space are
    kept as arrays in one bucket per free space; the non-empty free spaces are a sorted list, so
    finding the best fit is a bisection. 10M documents: `benchmarks/best_fit.py`. The rows' loads
    are those of the one-item-at-a-time rule (which of several rows with the same free space takes
    an item changes no load).
    """
    offsets = np.asarray(doc_offsets, dtype=np.int64)
    starts, lengths = offsets[:-1], np.diff(offsets)
    full = lengths // seq_len
    # whole seq_len pieces of long documents: a row each
    n_full = int(full.sum())
    doc = np.repeat(np.arange(len(lengths)), full)
    k = np.arange(n_full, dtype=np.int64) - np.repeat(np.cumsum(full) - full, full)
    full_pieces = np.stack([starts[doc] + k * seq_len, np.full(n_full, seq_len, dtype=np.int64)], axis=1)
    # items: the tails, longest first (ties in document order)
    tail = lengths - full * seq_len
    has = np.flatnonzero(tail)
    order = has[np.argsort(-tail[has], kind="stable")]
    item_len = tail[order]
    item_start = starts[order] + full[order] * seq_len
    item_row = place(item_len, seq_len)
    n_rows = int(item_row.max()) + 1 if len(item_row) else 0
    # pieces grouped by row, in placement order (a stable sort of the rows)
    by_row = np.argsort(item_row, kind="stable")
    tail_pieces = np.stack([item_start[by_row], item_len[by_row]], axis=1)
    per_row = np.bincount(item_row, minlength=n_rows)
    row_offsets = np.concatenate([[0], np.cumsum(per_row), len(tail_pieces) + np.arange(1, n_full + 1)])
    pieces = np.concatenate([tail_pieces.reshape(-1, 2), full_pieces.reshape(-1, 2)])
    return pieces.astype(np.int64), row_offsets.astype(np.int64)


def place(item_len: np.ndarray, seq_len: int) -> np.ndarray:
    """The row of each item (lengths in decreasing order, each 1..seq_len) under best-fit
    decreasing; rows are numbered in the order they are opened."""
    rows = np.empty(len(item_len), dtype=np.int64)
    buckets: dict[int, list[np.ndarray]] = {}  # free space -> arrays of rows with that free space
    counts: dict[int, int] = {}
    free: list[int] = []  # the non-empty free spaces, ascending
    opened = 0

    def take(space: int, n: int) -> np.ndarray:
        chunks, got = buckets[space], []
        while n:
            last = chunks[-1]
            if len(last) <= n:
                got.append(chunks.pop())
                n -= len(last)
            else:
                got.append(last[len(last) - n :])
                chunks[-1] = last[: len(last) - n]
                n = 0
        counts[space] -= sum(len(g) for g in got)
        if not counts[space]:
            del buckets[space], counts[space]
            free.pop(bisect.bisect_left(free, space))
        return got[0] if len(got) == 1 else np.concatenate(got[::-1])

    def put(space: int, ids: np.ndarray) -> None:
        if not len(ids) or space == 0:
            return
        if space not in counts:
            bisect.insort(free, space)
            buckets[space], counts[space] = [], 0
        buckets[space].append(ids)
        counts[space] += len(ids)

    sizes, first = np.unique(-item_len, return_index=True)  # decreasing lengths, where each starts
    bounds = [*first.tolist(), len(item_len)]
    for size, lo, hi in zip((-sizes).tolist(), bounds[:-1], bounds[1:], strict=True):
        at = lo
        while at < hi:
            left = hi - at
            j = bisect.bisect_left(free, size)
            if j == len(free):  # no open row holds it: open rows, each filled with seq_len // size items
                space, per = seq_len, seq_len // size
                n_new = -(-left // per)
                ids = np.arange(opened, opened + n_new, dtype=np.int64)
                opened += n_new
            else:
                space = free[j]
                per = space // size
                n_new = min(counts[space], -(-left // per))
                ids = take(space, n_new)
            filled = min(left // per, len(ids))  # rows that take `per` items
            rows[at : at + filled * per] = np.repeat(ids[:filled], per)
            put(space - per * size, ids[:filled])
            at += filled * per
            if filled < len(ids):  # one row takes the last few items of this length
                rest = hi - at
                rows[at:hi] = ids[filled]
                put(space - rest * size, ids[filled : filled + 1])
                at = hi
    return rows


def best_fit_rows(doc_offsets: np.ndarray, seq_len: int, source: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A split's best-fit rows as format 3 stores them: rows (n, 4) [source, first piece, pieces,
    tokens] and pieces (m, 3) [source, start, length] (`moai.formats.tokens`)."""
    pieces, row_offsets = best_fit(doc_offsets, seq_len)
    counts = np.diff(row_offsets)
    tokens = np.add.reduceat(pieces[:, 1], row_offsets[:-1]) if len(counts) else np.empty(0, dtype=np.int64)
    src = np.full(len(counts), source, dtype=np.int64)
    rows = np.stack([src, row_offsets[:-1], counts, tokens], axis=1).astype(np.int64).reshape(-1, 4)
    return rows, np.column_stack([np.full(len(pieces), source, dtype=np.int64), pieces]).reshape(-1, 3)


def best_fit_report(rows: np.ndarray, doc_offsets: np.ndarray, seq_len: int) -> dict[str, Any]:
    """Rows, padding and documents split of a split's best-fit rows (a document is split only
    when it is longer than seq_len)."""
    tokens = int(rows[:, 3].sum()) if len(rows) else 0
    slots = len(rows) * seq_len
    lengths = np.diff(doc_offsets)
    return {
        "rows": len(rows),
        "padding_tokens": slots - tokens,
        "padding_fraction": round((slots - tokens) / slots, 6) if slots else 0.0,
        "documents_split": int(np.count_nonzero(lengths > seq_len)),
    }
