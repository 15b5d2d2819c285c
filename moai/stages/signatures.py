"""signatures: the per-document hashes deduplication compares (the exact key, the MinHash bands).

Cut into parts of `ROWS_PER_PART` rows, fixed by the data alone. Each part is published in the
store as `signatures-parts/<key>-<index>/` (computed by `moai dedup-shard` units on a Slurm array
or Dask, or here in the hardware plan's processes); the stage's output concatenates them, so it
is byte-identical whether 1 or N units computed the parts, in whatever order. Memory: the text is
memory-mapped and read a part at a time; what is kept is 16 bytes (exact) + 8 × bands bytes (near)
per document, never the text.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from moai.clean.minhash import MinHasher, derive_bands, exact_keys
from moai.clean.rows import processes
from moai.config import ConfigError, DedupConfig, PipelineConfig
from moai.formats.text import MappedTable, text_bytes
from moai.report import timing
from moai.stages.chain import before, on
from moai.store import Store
from moai.workers import spawn_pool

log = logging.getLogger(__name__)

NAME = "signatures"
VERSION = 3  # 2: parts of 5,000 rows; 3: datatrove's shingles and MinHash, parts of 2,000 rows
PARTS_STAGE = "signatures-parts"
ROWS_PER_PART = 2_000  # small enough to keep every worker busy to the end; each part starts a little work


def enabled(config: PipelineConfig) -> bool:
    return on(config, "dedup")


def reads(config: PipelineConfig) -> tuple[str, ...]:
    return (before(config, "dedup"),)


def hasher(cfg: DedupConfig) -> MinHasher | None:
    """The MinHash of `dedup.near` with its bands × rows (given, or derived from the threshold)."""
    near = cfg.near
    if near is None:
        return None
    bands, rows = (near.bands, near.rows)
    if bands is None or rows is None:
        bands, rows = derive_bands(near.threshold, near.num_perm, verify=near.verify)
    return MinHasher(near.ngram, near.num_perm, bands, rows, near.seed)


def settings(config: PipelineConfig) -> dict[str, Any]:
    assert config.dedup is not None
    mh = hasher(config.dedup)
    return {
        "exact": config.dedup.exact,
        "near": None if mh is None else {k: getattr(mh, k) for k in ("ngram", "num_perm", "bands", "rows", "seed")},
    }


def part_key(key: str, index: int) -> str:
    return f"{key}-{index:05d}"


def part_ranges(num_rows: int) -> list[tuple[int, int]]:
    return [(lo, min(num_rows, lo + ROWS_PER_PART)) for lo in range(0, num_rows, ROWS_PER_PART)]


def compute_part(text_dir: str, lo: int, hi: int, exact: bool, mh: MinHasher | None, out: Path) -> dict[str, Any]:
    started = time.perf_counter()
    texts = MappedTable(text_dir).table.column(0).slice(lo, hi - lo).combine_chunks()
    if exact:
        np.save(out / "exact.npy", exact_keys(texts))
    if mh is not None:
        np.save(out / "bands.npy", mh(texts))
    return {"rows": hi - lo, "lo": lo, "hi": hi, "seconds": round(time.perf_counter() - started, 3)}


def _publish_part(root: str, key: str, index: int, text_dir: str, lo: int, hi: int, exact: bool, mh) -> bool:
    store = Store(root)
    pub = store.build(PARTS_STAGE, part_key(key, index), lambda out: compute_part(text_dir, lo, hi, exact, mh, out))
    return pub.built


def run_unit(
    config: PipelineConfig, key: str, inputs: dict[str, Any], *, shard_index: int, num_shards: int
) -> dict[str, Any]:
    """One `moai dedup-shard` unit: publish the parts at positions ≡ shard_index (mod num_shards) of
    the stage output `key` (`inputs`: what the stage reads, as `pipeline.stage_inputs` gives them)."""
    if not 0 <= shard_index < num_shards:
        raise ConfigError(f"--shard-index {shard_index} must be in [0, {num_shards})")
    assert config.dedup is not None
    started = time.perf_counter()
    text_dir = Path(inputs[before(config, "dedup")].path)
    ranges = part_ranges(MappedTable(text_dir).table.num_rows)
    mine = [(i, r) for i, r in enumerate(ranges) if i % num_shards == shard_index]
    mh = hasher(config.dedup)
    built = sum(
        _publish_part(config.cache_dir, key, i, str(text_dir), lo, hi, config.dedup.exact, mh) for i, (lo, hi) in mine
    )
    return {
        "shard_index": shard_index,
        "num_shards": num_shards,
        "parts": len(mine),
        "built": built,
        "skipped": len(mine) - built,
        "seconds": round(time.perf_counter() - started, 3),
    }


def build(ctx, out: Path) -> dict[str, Any]:
    cfg: DedupConfig = ctx.config.dedup
    text_dir = ctx.path(before(ctx.config, "dedup"))
    started = time.perf_counter()
    table = MappedTable(text_dir).table
    ranges = part_ranges(table.num_rows)
    store: Store = ctx.store
    mh = hasher(cfg)
    todo = [(i, r) for i, r in enumerate(ranges) if not store.exists(PARTS_STAGE, part_key(ctx.key, i))]
    num_proc = min(processes(ctx.plan, int(text_bytes(table).sum())), len(todo))
    if todo:
        log.info("signatures: %d of %d parts to compute in %d process(es)", len(todo), len(ranges), max(1, num_proc))
    args = [(str(store.root), ctx.key, i, str(text_dir), lo, hi, cfg.exact, mh) for i, (lo, hi) in todo]
    if num_proc > 1:
        with spawn_pool(num_proc) as pool:
            futures = [pool.submit(_publish_part, *a) for a in args]
            for done, f in enumerate(futures, 1):
                f.result()
                if ctx.on_progress:
                    ctx.on_progress(done / len(futures))
    else:
        for done, a in enumerate(args, 1):
            _publish_part(*a)
            if ctx.on_progress:
                ctx.on_progress(done / len(args))
    parts = [store.read(PARTS_STAGE, part_key(ctx.key, i)).path for i in range(len(ranges))]
    for name, width in (("exact", 2 if cfg.exact else 0), ("bands", mh.bands if mh else 0)):
        if width:
            arrays = [np.load(p / f"{name}.npy") for p in parts]
            np.save(out / f"{name}.npy", np.concatenate(arrays) if arrays else np.zeros((0, width), np.uint64))
    return {
        "rows_in": table.num_rows,
        "rows_out": table.num_rows,
        "parts": len(ranges),
        "parts_computed_here": len(todo),
        "bands": mh.bands if mh else None,
        "rows_per_band": mh.rows if mh else None,
        **timing(float(text_bytes(table).sum()) / 1e6, started),
    }
