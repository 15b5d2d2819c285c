"""The tokenize stage as independent units, for Slurm job arrays and other schedulers.

A tokenize stage's parts (fixed byte ranges of the saved text, see `parts`) are
dealt round-robin to N shards. A shard publishes each of its parts in the store under
`tokenize-parts/<tokenize key>-<split>-<index>/`, with the store's guarantees: a finished part is
never redone (its manifest is the completion marker), two processes on the same part build it
once, and a killed unit leaves nothing that looks finished. `merge` then publishes the ordinary
token store `tokenize/<key>/` from the parts (hard links where the filesystem allows): its files
are byte-identical to those of a single local run, whatever N and whatever order the units ran.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Any

from moai.config import ConfigError
from moai.errors import DataError
from moai.stages.tokenize.engine import choose_encoder, clear_encoder, init_encoder
from moai.stages.tokenize.parts import (
    SPLITS,
    documents_a_call,
    encode_parts,
    plan_parts,
    remember_ids_digests,
    store_counts,
    write_origins,
    write_store_meta,
)
from moai.stages.tokenizer import TokenizerInfo
from moai.store import Store

PARTS_STAGE = "tokenize-parts"


def part_key(tokenize_key: str, split: str, index: int) -> str:
    return f"{tokenize_key}-{split}-{index:05d}"


def shard_of(position: int, num_shards: int) -> int:
    return position % num_shards


def run_shard(
    store: Store,
    tokenize_key: str,
    info: TokenizerInfo,
    text_dir: Path,
    *,
    shard_index: int,
    num_shards: int,
    batch_size: int,
    threads: int,
    engine: str = "auto",
    fast_batch_size: int | None = None,
) -> dict[str, Any]:
    """Encode and publish the parts of shard `shard_index` of `num_shards`; skip those already done.
    `batch_size`, `fast_batch_size`: documents a call at most (`tokenize`'s)."""
    if not 0 <= shard_index < num_shards:
        raise ConfigError(f"--shard-index {shard_index} must be in [0, {num_shards})")
    started = time.perf_counter()
    jobs = [
        j
        for pos, j in enumerate(plan_parts(info, text_dir, Path("."), batch_size))
        if shard_of(pos, num_shards) == shard_index
    ]
    todo = [j for j in jobs if not store.exists(PARTS_STAGE, part_key(tokenize_key, j.split, j.index))]
    built = 0
    reason = "no part left to encode"
    if todo:
        choice = choose_encoder(info, text_dir, engine, threads)
        reason = choice.engine_reason
        init_encoder(choice.setup, encoder=choice.encoder)
        batch_size = documents_a_call(choice.engine, batch_size, fast_batch_size)
        try:
            for job in todo:

                def build(out: Path, job=job) -> dict[str, Any]:
                    (out / job.split).mkdir()
                    r = encode_parts([dataclasses.replace(job, out_dir=str(out), batch_size=batch_size)])[0]
                    remember_ids_digests(out, [r])
                    return {**r, "engine": choice.engine}

                if store.build(PARTS_STAGE, part_key(tokenize_key, job.split, job.index), build).built:
                    built += 1
        finally:
            clear_encoder()
    return {
        "shard": shard_index,
        "num_shards": num_shards,
        "parts": len(jobs),
        "built": built,
        "skipped": len(jobs) - built,
        "engine_reason": reason,
        "seconds": round(time.perf_counter() - started, 3),
    }


def merge(
    store: Store, tokenize_key: str, info: TokenizerInfo, text_dir: Path, out_dir: Path, num_shards: int | None = None
) -> dict[str, Any]:
    """Build the token store in `out_dir` from published parts; a clear error lists missing ones."""
    started = time.perf_counter()
    jobs = plan_parts(info, text_dir, out_dir, batch_size=1)
    for split in SPLITS:
        (out_dir / split).mkdir(parents=True, exist_ok=True)
    missing = [
        (pos, j)
        for pos, j in enumerate(jobs)
        if not store.exists(PARTS_STAGE, part_key(tokenize_key, j.split, j.index))
    ]
    if missing:
        names = ", ".join(f"{j.split}/part-{j.index:05d}" for _, j in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        hint = ""
        if num_shards:
            shards = sorted({shard_of(pos, num_shards) for pos, _ in missing})
            hint = f"; run moai tokenize-shard for --shard-index {shards} of --num-shards {num_shards}"
        raise DataError(f"{len(missing)} of {len(jobs)} tokenize parts are not done: {names}{more}{hint}")
    results = []
    engines = set()
    for j in jobs:
        part = store.read(PARTS_STAGE, part_key(tokenize_key, j.split, j.index))
        rel = Path(j.split) / f"part-{j.index:05d}"
        for suffix in (".bin", ".idx"):
            _link_or_copy(part.path / f"{rel}{suffix}", out_dir / f"{rel}{suffix}")
        report = part.manifest["report"]
        results.append(
            {k: report[k] for k in ("index", "split", "num_documents", "num_tokens", "bin", "idx")}
            | {k: report.get(k, 0) for k in ("large_documents", "forced_cuts")}
        )
        engines.add(report["engine"])
    write_origins(text_dir, out_dir, [(j.split, j.index, j.start, j.stop) for j in jobs])
    return {
        **store_counts(write_store_meta(info, out_dir, results), results),
        "parts": len(jobs),
        "engine": "+".join(sorted(engines)),
        "merged": True,
        "seconds": round(time.perf_counter() - started, 3),
        "warnings": info.warnings,
    }


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # published parts never change, so sharing the inode is safe
    except OSError:
        shutil.copyfile(src, dst)
