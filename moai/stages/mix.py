"""mix: one sample index over several sources' token stores, each source at exactly its share.

Each source's train split is cut into `seq_len` windows (`pack.concat_chunk`, full windows only).
The budget, `total_tokens // seq_len` windows (`moai.sources.total_tokens`), is shared out by
largest remainders of the exact shares (`allot`), so a source's realised tokens differ from its
share of the budget by less than one window. A source gives whole passes over its windows, each
in a fresh seeded order, then a seeded part of one more pass: at most `max_repetition` passes. A
budget a source cannot meet is a `DataError` naming the source, its tokens, the tokens it would
need, and the smallest change that fits (its weight, its max_repetition, or the total).

The sources are interleaved by a fixed schedule (`slots`): the samples are ordered by their
ideal times (j + ½) / nᵢ (source i's j-th of nᵢ), ties to the source listed first, so every
stretch of consecutive samples holds each source's share within about one sample (about 0.2
percentage points in 1,000 samples). Each sample's place is counted with integer divisions
rather than sorted, O(samples × sources); the index is written in place into the memory-mapped
`train.npy`. 10M samples of 3 sources: `benchmarks/mix.py`. The index is a pure function of
(seed, the sources' window counts, the settings); training reads it in stored order.

Output (`moai-sample-index/2`): `pack.json` (seq_len, mode "mix", order "as-stored", the
sources' names and token stores relative to the cache dir, samples per split) and `<split>.npy`,
int64 (n, 3) rows of [source index, start token, length] into that source's split of the same
name. Validation holds every validation window of every source, source after source.

With `pack.mode: best_fit`, a source's "windows" are its best-fit rows (`pack.best_fit`: whole
documents, at most seq_len tokens, the rest padding), chosen and interleaved exactly as windows
are; the budget counts rows of seq_len, so a source's realised tokens fall short of its share by
its padding (~0.001%, each source's `best_fit` report). The output is format 3: rows
[source, first piece, pieces, tokens] and `<split>.pieces.npy` [source, start, length].
"""

from __future__ import annotations

import json
import logging
import math
import time
import zlib
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from moai.config import PipelineConfig
from moai.errors import DataError
from moai.formats.tokens import BEST_FIT_FORMAT, MIX_FORMAT, TokenStore
from moai.sources import needs_gpu_count, shares, source_names, total_tokens
from moai.stages.pack import best_fit_report, best_fit_rows, concat_chunk

log = logging.getLogger(__name__)

NAME = "mix"
VERSION = 1
READS = ("tokenize",)
COMBINES = True  # reads the tokenize output of every source, not one source's


def enabled(config: PipelineConfig) -> bool:
    return config.sources is not None


def budget(config: PipelineConfig) -> tuple[int | None, str]:
    """The mix's token budget and where it comes from (the GPUs are counted only when it depends on them)."""
    num_gpus = 0
    if needs_gpu_count(config):
        from moai.hardware import gpu_count

        num_gpus = gpu_count()
    return total_tokens(config, num_gpus)


def settings(config: PipelineConfig) -> dict[str, Any]:
    """The sources' names, weights and caps, the resolved budget, seq_len and seed (not the sources'
    own settings: those are in the keys of their token stores, which this stage chains from)."""
    total, _ = budget(config)
    return {
        "sources": [
            {"name": s.name, "weight": s.weight, "max_repetition": s.max_repetition} for s in config.sources or ()
        ],
        "total_tokens": total,
        "seq_len": config.pack.seq_len,
        "drop_remainder": config.pack.drop_remainder,  # of the validation windows; train uses full windows only
        "seed": config.mix.seed,
        # only when not the default, so the keys of concat mixes stay as they were
        **({"mode": config.pack.mode} if config.pack.mode != "concat" else {}),
    }


def build(ctx, out: Path) -> dict[str, Any]:
    config: PipelineConfig = ctx.config
    stores = ctx.per_source("tokenize")
    total, total_from = budget(config)
    return mix(
        config,
        [stores[name] for name in source_names(config) or ()],
        out,
        cache_root=ctx.store.root,
        total=total,
        total_from=total_from,
    )


# -- the pure parts: shares, feasibility, order ----------------------------------------------------


def allot(shares_: list[Fraction], num_samples: int) -> list[int]:
    """`num_samples` shared by largest remainders: each count is floor or ceil of its exact share,
    and they add up to `num_samples`; ties go to the source listed first."""
    quotas = [s * num_samples for s in shares_]
    counts = [int(q) for q in quotas]  # floor: quotas are >= 0
    rest = num_samples - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[:rest]:
        counts[i] += 1
    return counts


def caps(windows: list[int], max_repetition: list[float]) -> list[int]:
    """The most windows each source may give: max_repetition passes over its windows."""
    return [int(Fraction(n) * Fraction(r)) for n, r in zip(windows, max_repetition, strict=True)]


def largest_budget(shares_: list[Fraction], cap: list[int]) -> int:
    """The most samples whose largest-remainder shares fit every source's cap."""
    # a count is at most its quota rounded up, so no budget above this one fits
    best = min(int((c + 1) / s) for c, s in zip(cap, shares_, strict=True) if s)
    while best > 0 and any(n > c for n, c in zip(allot(shares_, best), cap, strict=True)):
        best -= 1
    return best


def refuse(
    names: list[str],
    weights: list[float],
    max_repetition: list[float],
    windows: list[int],
    counts: list[int],
    seq_len: int,
) -> None:
    """A `DataError` naming the first source whose count is over its cap, with the changes that fit:
    (when it is the only one short) a lower weight or a higher max_repetition for it, or a smaller total."""
    shares_ = [Fraction(w) / sum(Fraction(x) for x in weights) for w in weights]
    cap = caps(windows, max_repetition)
    over = [i for i, (n, c) in enumerate(zip(counts, cap, strict=True)) if n > c]
    if not over:
        return
    i = over[0]
    name, total = names[i], sum(counts)
    fixes = []
    if len(over) == 1:
        weight = fitting_weight(weights, cap, i, total)
        if weight is not None:
            fixes.append(f"weight ≤ {weight:g} for {name}")
        if windows[i] > 0:
            fixes.append(f"max_repetition ≥ {fitting_repetition(windows[i], counts[i]):g} for {name}")
    empty = [j for j in over if cap[j] == 0]
    if empty:  # a source without one full window: only budgets too small to give it a sample fit
        fixes.append(f"lower pack.seq_len, add data to {names[empty[0]]!r} or remove it from sources")
    else:
        fixes.append(f"mix.total_tokens ≤ {largest_budget(shares_, cap) * seq_len:,}")
    also = f" ({', '.join(names[j] for j in over[1:])} short too)" if len(over) > 1 else ""
    raise DataError(
        f"mix: source {name!r} has {windows[i]:,} full windows of {seq_len} tokens ({windows[i] * seq_len:,}) and "
        f"max_repetition {max_repetition[i]:g}, but its share of {total * seq_len:,} tokens needs "
        f"{counts[i] * seq_len:,}{also}; set " + ", or ".join(fixes)
    )


def fitting_weight(weights: list[float], cap: list[int], i: int, total: int) -> float | None:
    """The largest weight for source i (4 significant digits, the others unchanged) at which every
    source fits its cap; None when none does (the others would then be short)."""
    others = sum(Fraction(w) for j, w in enumerate(weights) if j != i)
    if cap[i] == 0 or others == 0 or cap[i] >= total:
        return None
    guess = float(cap[i] * others / (total - cap[i]))
    scale = 10 ** (3 - int(np.floor(np.log10(guess))))
    w = int(guess * scale) / scale
    for _ in range(20):
        if w <= 0:
            return None
        trial = [Fraction(x) for x in weights]
        trial[i] = Fraction(w)
        counts = allot([x / sum(trial) for x in trial], total)
        if counts[i] <= cap[i]:
            return w if all(n <= c for n, c in zip(counts, cap, strict=True)) else None
        w = (round(w * scale) - 1) / scale
    return None


def fitting_repetition(windows: int, count: int) -> float:
    """The smallest max_repetition with two decimals whose cap holds `count` windows."""
    r = Fraction(math.ceil(Fraction(count, windows) * 100), 100)
    while caps([windows], [float(r)])[0] < count:  # the float of r may fall just under it
        r += Fraction(1, 100)
    return float(r)


def slots(counts: list[int], i: int) -> np.ndarray:
    """Where source i's samples go in the schedule: its j-th sample at the rank of its ideal time
    (2j + 1) / 2nᵢ among every source's, ties to the source listed first. Counted, not sorted:
    for each other source k, how many of its times come first is an integer division, O(nᵢ)."""
    n_i = counts[i]
    odd = 2 * np.arange(n_i, dtype=np.int64) + 1  # (2j + 1): times are odd / (2 n)
    out = np.arange(n_i, dtype=np.int64)
    for k, n_k in enumerate(counts):
        if k == i or n_k == 0:
            continue
        a = odd * n_k  # source k's m-th time (2m + 1) / 2n_k comes first when 2m + 1 < (or <=, k < i) a / n_i
        out += (a // n_i + 1) // 2 if k < i else (-(-a // n_i)) // 2
    return out


def interleave(counts: list[int]) -> np.ndarray:
    """The schedule as positions into the sources' samples laid end to end (source 0's first)."""
    order = np.empty(sum(counts), dtype=np.int64)
    at = 0
    for i, n in enumerate(counts):
        order[slots(counts, i)] = np.arange(at, at + n, dtype=np.int64)
        at += n
    return order


def passes(num_windows: int, count: int, seed: int, name: str) -> np.ndarray:
    """Which of a source's windows it gives, in order: whole passes, each a fresh seeded permutation,
    then a seeded subset of one more (never a window twice before every window once more)."""
    tag = zlib.crc32(name.encode())  # by name: adding a source leaves the others' orders as they were
    out = np.empty(count, dtype=np.int64)
    for p, at in enumerate(range(0, count, num_windows)):
        n = min(num_windows, count - at)
        out[at : at + n] = np.random.default_rng([seed, tag, p]).choice(num_windows, n, replace=False)
    return out


def mix_samples(
    windows: list[np.ndarray], counts: list[int], seed: int, names: list[str], out: np.ndarray | None = None
) -> np.ndarray:
    """(sum(counts), 1 + c) int64 [source, *window]: source i gives counts[i] of its `windows`
    ((n, c): [start, length] of concat windows, or [first piece, pieces, tokens] of best-fit rows)
    at its `slots`; written into `out` when given (a memory-mapped file)."""
    width = 1 + (windows[0].shape[1] if windows else 2)
    out = np.empty((sum(counts), width), dtype=np.int64) if out is None else out
    for i, (w, n) in enumerate(zip(windows, counts, strict=True)):
        if n:
            at, chosen = slots(counts, i), passes(len(w), n, seed, names[i])
            out[at, 0] = i
            out[at, 1:] = w[chosen]
    return out


def best_fit_parts(
    stores: list[TokenStore], split: str, seq_len: int
) -> tuple[list[np.ndarray], np.ndarray, list[dict[str, Any]]]:
    """Each source's best-fit rows of `split` as windows [first piece, pieces, tokens] into one
    pieces array (n, 3) [source, start, length] of every source, and each source's pack figures."""
    windows, pieces, reports, base = [], [], [], 0
    for i, s in enumerate(stores):
        offsets = s.split(split).doc_offsets
        rows, p = best_fit_rows(offsets, seq_len, source=i)
        rows[:, 1] += base
        base += len(p)
        windows.append(rows[:, 1:])
        pieces.append(p)
        reports.append(best_fit_report(rows, offsets, seq_len))
    return windows, np.concatenate(pieces).reshape(-1, 3), reports


# -- the stage -------------------------------------------------------------------------------------


def mix(
    config: PipelineConfig,
    store_dirs: list[Path],
    out_dir: Path,
    *,
    cache_root: Path,
    total: int | None,
    total_from: str,
) -> dict[str, Any]:
    """Write the mixed sample index of the train and validation splits; return the per-source report."""
    started = time.perf_counter()
    sources = config.sources or []
    names = [s.name for s in sources]
    weights = [s.weight for s in sources]
    reps = [s.max_repetition for s in sources]
    seq_len = config.pack.seq_len
    stores = [TokenStore(d) for d in store_dirs]
    train_tokens = [s.split("train").num_tokens for s in stores]
    best = config.pack.mode == "best_fit"
    if best:  # a source's windows are its best-fit rows: whole documents, each row at most seq_len tokens
        windows, pieces, packed = best_fit_parts(stores, "train", seq_len)
        np.save(out_dir / "train.pieces.npy", pieces)
    else:
        windows = [concat_chunk(n, seq_len, drop_remainder=True) for n in train_tokens]
    available = [len(w) for w in windows]
    shares_ = shares(config)
    budget = largest_budget(shares_, caps(available, reps)) if total is None else total // seq_len
    if budget == 0:
        raise DataError(
            f"mix: a budget of {total or 0:,} tokens ({total_from}) is less than one pack.seq_len={seq_len} window; "
            "raise mix.total_tokens or lower pack.seq_len"
        )
    counts = allot(shares_, budget)
    refuse(names, weights, reps, available, counts, seq_len)
    # written in place: the index never sits in memory twice (24 bytes a sample, in the page cache)
    width = 4 if best else 3
    train = np.lib.format.open_memmap(out_dir / "train.npy", mode="w+", dtype=np.int64, shape=(budget, width))
    mix_samples(windows, counts, config.mix.seed, names, out=train)
    train.flush()
    val_parts = []
    if best:
        val_windows, val_pieces, _ = best_fit_parts(stores, "validation", seq_len)
        np.save(out_dir / "validation.pieces.npy", val_pieces)
        val_parts = [np.column_stack([np.full(len(v), i, dtype=np.int64), v]) for i, v in enumerate(val_windows)]
    else:
        for i, s in enumerate(stores):
            v = concat_chunk(s.split("validation").num_tokens, seq_len, config.pack.drop_remainder)
            val_parts.append(np.column_stack([np.full(len(v), i, dtype=np.int64), v]))
    validation = np.concatenate(val_parts).astype(np.int64).reshape(-1, width)
    np.save(out_dir / "validation.npy", validation)
    # tokens each source gives (best-fit rows hold at most seq_len, the rest is padding)
    realised = (
        np.rint(np.bincount(train[:, 0], weights=train[:, 3], minlength=len(names))).astype(np.int64)
        if best
        else np.array(counts, dtype=np.int64) * seq_len
    )
    val_counts = np.bincount(validation[:, 0], minlength=len(names))
    meta = {
        "format": BEST_FIT_FORMAT if best else MIX_FORMAT,
        "seq_len": seq_len,
        "mode": "best_fit" if best else "mix",
        "order": "as-stored",
        "sources": [
            {"name": n, "token_store": str(d.relative_to(cache_root))} for n, d in zip(names, store_dirs, strict=True)
        ],
        "splits": {"train": len(train), "validation": len(validation)},
    }
    (out_dir / "pack.json").write_text(json.dumps(meta, indent=2))
    rows = [
        {
            "name": names[i],
            "weight": weights[i],
            "share": round(float(shares_[i]), 6),
            "max_repetition": reps[i],
            "tokens_available": train_tokens[i],
            "windows_available": available[i],
            "target_tokens": round(float(shares_[i] * budget * seq_len)),
            "realised_tokens": int(realised[i]),
            "realised_share": round(counts[i] / budget, 6),
            "samples": counts[i],
            "epochs": round(counts[i] / available[i], 4) if available[i] else 0.0,
            "validation_samples": int(val_counts[i]),
            **({"best_fit": packed[i]} if best else {}),
        }
        for i in range(len(names))
    ]
    for r in rows:
        log.info("mix: %s", {k: r[k] for k in ("name", "share", "realised_share", "samples", "epochs")})
    return {
        "rows_in": sum(available),
        "rows_out": len(train) + len(validation),
        "samples": {"train": len(train), "validation": len(validation)},
        "seq_len": seq_len,
        "tokens": budget * seq_len,
        "total_tokens": total,
        "total_from": total_from,
        "sources": rows,
        **(_best_fit_totals(packed, seq_len) if best else {}),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _best_fit_totals(packed: list[dict[str, Any]], seq_len: int) -> dict[str, Any]:
    """The sources' best-fit rows together: padding fraction and documents split (the train splits)."""
    slots = sum(p["rows"] for p in packed) * seq_len
    padding = sum(p["padding_tokens"] for p in packed)
    return {
        "padding_fraction": round(padding / slots, 6) if slots else 0.0,
        "documents_split": sum(p["documents_split"] for p in packed),
    }
