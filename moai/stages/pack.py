"""pack: a sample index of `seq_len` windows over the token store (see `moai.formats.tokens`).

Concatenate-and-chunk: the split's documents, each ending in EOS, form one stream cut into
consecutive `seq_len` windows. Every token lands in exactly one window, no padding is needed,
and the cost is that documents crossing a window edge are split (20–35% of them at 2k–4k for
typical length distributions); `position_ids` restart at every document start so attention
never crosses a boundary. With `drop_remainder` the last, shorter window is left out and
reported. The index is a pure function of (document offsets, seq_len).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from moai.config import PackConfig, PipelineConfig
from moai.errors import DataError
from moai.formats.tokens import PACK_FORMAT, TokenStore

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
        samples = concat_chunk(split.num_tokens, cfg.seq_len, cfg.drop_remainder)
        np.save(out_dir / f"{name}.npy", samples)
        used = int(samples[:, 1].sum()) if len(samples) else 0
        offsets = split.doc_offsets
        lengths = np.diff(offsets)
        splits[name] = {
            "samples": len(samples),
            "tokens": split.num_tokens,
            "tokens_used": used,
            "tokens_dropped": split.num_tokens - used,
            "fraction_used": round(used / split.num_tokens, 6) if split.num_tokens else 0.0,
            "documents": split.num_documents,
            "documents_split": documents_split(offsets, cfg.seq_len) if len(offsets) > 1 else 0,
            "length_histogram": length_histogram(lengths, cfg.seq_len) if len(lengths) else [],
            "mean_document_tokens": round(float(lengths.mean()), 1) if len(lengths) else 0.0,
        }
    if splits.get("train", {}).get("samples", 0) == 0:
        raise DataError(
            f"the train split has {splits.get('train', {}).get('tokens', 0)} tokens, fewer than one "
            f"pack.seq_len={cfg.seq_len} window; lower pack.seq_len or add data"
        )
    meta = {
        "format": PACK_FORMAT,
        "seq_len": cfg.seq_len,
        "mode": cfg.mode,
        "drop_remainder": cfg.drop_remainder,
        "token_store": store_ref,
        "splits": {k: v["samples"] for k, v in splits.items()},
    }
    (out_dir / "pack.json").write_text(json.dumps(meta, indent=2))
    train = splits["train"]
    warnings = empty_validation(splits, cfg.seq_len)
    for w in warnings:
        log.warning(w)
    return {
        "rows_in": sum(s["documents"] for s in splits.values()),
        "rows_out": sum(s["samples"] for s in splits.values()),
        "samples": {k: v["samples"] for k, v in splits.items()},
        "seq_len": cfg.seq_len,
        "tokens": sum(s["tokens"] for s in splits.values()),
        "fraction_used": train["fraction_used"],
        "splits": splits,
        "warnings": warnings,
        "seconds": round(time.perf_counter() - started, 3),
    }


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
