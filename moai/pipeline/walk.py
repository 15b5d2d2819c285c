"""The walk: each node built once through the store or reused (`run_stage`), in order (`walk`), and
the runs made of it: `prepare`, `merge`, and one unit of a stage that runs as units (Slurm arrays)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moai import heap
from moai.config import PipelineConfig
from moai.hardware import Plan, data_plan
from moai.pipeline.graph import (
    BuildContext,
    Inputs,
    StageResult,
    key_of,
    node,
    nodes,
    roots,
    split_name,
    stage_inputs,
    upstream,
)
from moai.pipeline.summary import summary
from moai.presets import config_origin
from moai.stages import signatures, tokenize
from moai.store import Store

log = logging.getLogger(__name__)


def run_stage(
    config: PipelineConfig,
    name: str,
    inputs: Inputs,
    *,
    plan: Plan | None = None,
    progress: bool = True,
    on_progress: Callable[[float], None] | None = None,
    options: dict[str, Any] | None = None,
) -> StageResult:
    """Reuse the published output of a stage, or build it once (see `moai.store`)."""
    s = node(config, name).stage
    from moai.remote_cache import remote_of

    store = Store(config.cache_dir, origin=config_origin(config), remote=remote_of(config))
    key = key_of(config, name, inputs)
    cfg, stage_in = stage_inputs(config, name, inputs)
    ups, settings = upstream(config, name, inputs), s.settings(cfg)

    def build(out: Path) -> dict[str, Any]:
        ctx = BuildContext(
            cfg,
            plan or data_plan(config),
            stage_in,
            store,
            key,
            progress,
            on_progress,
            options or {},
        )
        heap.trim()  # what the stages before freed: not resident under this one
        return s.build(ctx, out)

    pub = store.build(s.name, key, build, manifest={"upstream": ups, "settings": settings, "version": s.version})
    if not pub.built:  # a build is logged once, by the store, with its path ("published ...")
        log.info("%s: reused %s", name, pub.path)
    return StageResult(name, key, str(pub.path), dict(pub.manifest["report"]), pub.built)


Run = Callable[[str, Inputs], StageResult]


def walk(
    config: PipelineConfig,
    run: Run | None = None,
    *,
    until: str | None = None,
    root_values: dict[str, str] | None = None,
) -> dict[str, StageResult]:
    """Run the enabled stages in order with `run(name, inputs)` (default `run_stage`), up to and
    including `until`; return every stage's result by name."""
    run = run or (lambda name, inputs: run_stage(config, name, inputs))
    results: Inputs = dict(root_values if root_values is not None else roots(config))
    out: dict[str, StageResult] = {}
    for n in nodes(config):
        out[n.name] = results[n.name] = run(n.name, {r: results[r] for r in n.reads})
        if n.name == until:
            break
    return out


def is_published(config: PipelineConfig, name: str, inputs: Inputs) -> bool:
    return Store(config.cache_dir).exists(node(config, name).stage.name, key_of(config, name, inputs))


def prepare(
    config: PipelineConfig,
    plan: Plan | None = None,
    progress: bool = True,
    first: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Run every data stage (no Prefect) and return `summary`. From the first stage to build,
    transformers loads the tokenizer in another process meanwhile, for the tokenizer and tokenize
    stages' checks (`reference`). `first` (the preflight checks) runs before the stages; on a cold
    cache (`cold_cache`) transformers starts loading before it, so its imports and loading (1.4 s
    for Tekken's 131k vocabulary) go beside the checks instead of after them."""
    from moai.stages.tokenize import reference

    with reference.prefetch_when_building(config, plan) as building:
        if first is not None:
            if cold_cache(config):
                building()
            first()

        def run(name: str, inputs: Inputs) -> StageResult:
            if not is_published(config, name, inputs):
                building()
            return run_stage(config, name, inputs, plan=plan, progress=progress)

        return summary(walk(config, run))


def cold_cache(config: PipelineConfig) -> bool:
    """Does the cache hold no token store at all (a first run: every stage up to tokenize will be
    built)? Looked up without fingerprinting anything; a run that finds one starts transformers
    only if a stage is built (`prepare`)."""
    return not any((Path(config.cache_dir).expanduser() / tokenize.NAME).glob("*/_manifest.json"))


def merge(config: PipelineConfig, num_shards: int | None = None) -> dict[str, Any]:
    """Publish the token store from tokenize-shard units, then the rest of the graph; return `summary`."""
    options = {"num_shards": num_shards or 0}  # 0: merge without naming the missing shards' indices
    return summary(
        walk(
            config,
            lambda name, inputs: run_stage(
                config, name, inputs, progress=False, options=options if split_name(name)[0] == tokenize.NAME else None
            ),
        )
    )


UNIT_STAGES = {tokenize.NAME: tokenize, signatures.NAME: signatures}  # stages that run as independent units


def run_units(config: PipelineConfig, stage_name: str, shard_index: int, num_shards: int) -> dict[str, Any]:
    """Unit `shard_index` of `num_shards` of stage `stage_name` (tokenize, or the dedup signatures):
    the stages before it, then the unit's parts; with several sources, that unit of every source
    (reported by source)."""
    module = UNIT_STAGES[stage_name]
    order = nodes(config)
    at = [i for i, n in enumerate(order) if n.stage.name == stage_name]
    if not at:
        from moai.errors import ConfigError

        raise ConfigError(f"this config has no {stage_name} stage (stages: {[n.name for n in order]})")
    done = walk(config, until=order[at[0] - 1].name)
    units = {}
    for i in at:
        n = order[i]
        inputs = {r: done[r] for r in n.reads}
        cfg, stage_in = stage_inputs(config, n.name, inputs)
        units[n.source] = module.run_unit(
            cfg, key_of(config, n.name, inputs), stage_in, shard_index=shard_index, num_shards=num_shards
        )
    return units.get(None, {"sources": units})


def tokenize_shard(config: PipelineConfig, shard_index: int, num_shards: int) -> dict[str, Any]:
    """One unit of the tokenize stage (see `moai.stages.tokenize.units`). With dedup on, the unit
    first computes its share of the dedup signatures (reported under "signatures"): one Slurm array
    spreads both. The stages between (the clustering, the other cleaning stages) are built once, by
    the first unit to reach them (the others wait on the store's lock and, while a signature part is
    still missing, compute it or wait for the unit computing it)."""
    first = {}
    if any(n.stage.name == signatures.NAME for n in nodes(config)):
        first["signatures"] = run_units(config, signatures.NAME, shard_index, num_shards)
    return run_units(config, tokenize.NAME, shard_index, num_shards) | first
