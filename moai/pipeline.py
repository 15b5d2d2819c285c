"""The stage graph: every stage declared once, one function computes keys, one walks the graph.

A stage is a module (`moai/stages/*.py`) that declares

    NAME                     its folder in the store: <cache_dir>/<NAME>/<key>/
    VERSION                  bumped when the stage's output changes, so old caches rebuild
    READS or reads(config)   the stages (or roots) it reads, in order
    settings(config) -> dict what in the config changes its output
    build(ctx, out) -> dict  writes `out` from `ctx.inputs`, returns the report
    enabled(config) -> bool  optional; a stage that is off is skipped with everything reading it

`REGISTRY` lists the stages in order; adding a stage is one module and one line here (or
`register(...)`). A stage's key hashes its name, VERSION, settings and the keys of what it reads
(`key_of`), so a key is known before anything runs. The roots of the keys are fingerprints of
content (`ROOTS`): the source files (or the hub dataset's fingerprint) and a given tokenizer's
files. `walk` runs the stages in order through one `run` function: `run_stage` here (build once
through the store, or reuse), a Prefect task in `flows/pretrain.py`. `moai prepare`, `moai merge`,
`moai tokenize-shard` and the flow all walk this same graph.

With several sources (`sources:`), the graph has one node per stage and source for the stages
that read a source (`convert[ko]`, `filter[ko]`, ..., `tokenize[ko]`): each runs the stage on the
config `moai.sources.source_config` derives for its source, reads that source's nodes under the
stage names (`ctx.path("save")`), and is stored as `<cache_dir>/<stage>/<key>/` under the key a
single-source config of that source would have. A stage declaring `COMBINES = True` (the trained
tokenizer, `mix`) is one node that reads every source's node (`ctx.per_source("tokenize")`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from moai.config import PipelineConfig, read_env
from moai.hardware import Plan, detect, plan as make_plan
from moai.presets import config_origin
from moai.sources import source_config, source_names
from moai.stages import (
    convert,
    decontaminate,
    dedup,
    filter as filter_stage,
    language,
    mix,
    pack,
    quality,
    save,
    signatures,
    tokenize,
    tokenizer,
)
from moai.store import Store, stage_key

log = logging.getLogger(__name__)

Inputs = dict[str, Any]  # what a stage reads: StageResult of a stage, or the fingerprint string of a root


@dataclass(frozen=True)
class StageResult:
    """What a stage hands downstream: where its output is, its key, its report, and whether it was built now."""

    stage: str
    key: str
    path: str
    report: dict[str, Any]
    built: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Stage:
    name: str
    version: int
    reads: Callable[[PipelineConfig], tuple[str, ...]]
    settings: Callable[[PipelineConfig], dict[str, Any]]
    build: Callable[[BuildContext, Path], dict[str, Any]]
    enabled: Callable[[PipelineConfig], bool] = lambda config: True
    combines: bool = False  # with several sources: one node reading every source's node, not one per source
    # with several sources: a source's node also reads these stages' nodes of every source before it
    # (cross-source deduplication keeps the copy in the earlier source)
    reads_earlier: tuple[str, ...] = ()

    @classmethod
    def of(cls, module: ModuleType) -> Stage:
        """The stage a module declares (see the module docstring)."""
        reads = getattr(module, "reads", None) or (lambda config, fixed=tuple(module.READS): fixed)
        return cls(
            module.NAME,
            module.VERSION,
            reads,
            module.settings,
            module.build,
            getattr(module, "enabled", lambda config: True),
            bool(getattr(module, "COMBINES", False)),
            tuple(getattr(module, "READS_EARLIER", ())),
        )


@dataclass(frozen=True)
class Node:
    """One run of a stage in the graph: the stage for one source (`convert[ko]`) or for all (`mix`)."""

    name: str
    stage: Stage
    source: str | None  # the source it runs on; None: the config as given
    reads: tuple[str, ...]  # the nodes (or roots) it reads, in order


def node_name(stage_name: str, source: str | None) -> str:
    return stage_name if source is None else f"{stage_name}[{source}]"


def split_name(name: str) -> tuple[str, str | None]:
    """`convert[ko]` → ("convert", "ko"); `mix` → ("mix", None)."""
    if name.endswith("]") and "[" in name:
        base, _, rest = name.partition("[")
        return base, rest[:-1]
    return name, None


@dataclass
class BuildContext:
    """What `build(ctx, out)` gets: the config, the hardware plan, its inputs, the store."""

    config: PipelineConfig
    plan: Plan
    inputs: Inputs
    store: Store
    key: str
    progress: bool = True
    on_progress: Callable[[float], None] | None = None  # fraction done, for long stages
    options: dict[str, Any] = field(default_factory=dict)  # per-run variants, e.g. {"num_shards": N} (merge)

    def path(self, name: str) -> Path:
        """The published folder of input `name`."""
        return Path(self.inputs[name].path)

    def per_source(self, name: str) -> dict[str, Path]:
        """A combining stage's inputs of stage `name`, by source (`{"ko": <tokenize[ko] folder>, ...}`);
        for a source's node, the earlier sources' nodes it reads (`READS_EARLIER`), in config order."""
        named = {split_name(node): value for node, value in self.inputs.items()}
        return {source: Path(v.path) for (base, source), v in named.items() if base == name and source is not None}


# Roots: what keys start from. Each reads content (it may take a while on a large corpus).
ROOTS: dict[str, Callable[[PipelineConfig], str]] = {
    "source": lambda config: convert.source_fingerprint(_one_source(config)),
    "tokenizer-files": lambda config: tokenizer.tokenizer_fingerprint(config.tokenizer),
}

REGISTRY: list[Stage] = [
    Stage.of(m)
    for m in (
        convert,
        filter_stage,
        signatures,
        dedup,
        quality,
        language,
        decontaminate,
        save,
        tokenizer,
        tokenize,
        pack,
        mix,
    )
]


def _one_source(config: PipelineConfig):
    assert config.source is not None, "a source root is taken on a single-source config (one per source node)"
    return config.source


def stage(name: str) -> Stage:
    for s in REGISTRY:
        if s.name == name:
            return s
    raise KeyError(f"no stage {name!r} (stages: {[s.name for s in REGISTRY]})")


def register(new: Stage, *, after: str | None = None) -> None:
    """Add a stage to the graph, after stage `after` (default: at the end). Names are unique: they
    are the stages' folders in the store."""
    if any(s.name == new.name for s in REGISTRY):
        raise ValueError(f"a stage named {new.name!r} is registered already")
    at = len(REGISTRY) if after is None else REGISTRY.index(stage(after)) + 1
    REGISTRY.insert(at, new)


def stages(config: PipelineConfig) -> list[Stage]:
    """The enabled stages in order; a stage reading a disabled one is off too."""
    on: list[Stage] = []
    names = set(ROOTS)
    for s in REGISTRY:
        if s.enabled(config) and all(r in names for r in s.reads(config)):
            on.append(s)
            names.add(s.name)
    return on


def nodes(config: PipelineConfig) -> list[Node]:
    """The enabled stages as graph nodes, in order. One source: a node per stage, named as the stage.
    Several: a node per source for each stage that reads a source (the root `source` and what
    chains from it), in config order; a combining stage reads every source's node."""
    names = source_names(config)
    if names is None:
        return [Node(s.name, s, None, s.reads(config)) for s in stages(config)]
    per_source = {"source"}
    out: list[Node] = []
    for s in stages(config):
        reads = s.reads(config)
        if s.combines:
            expanded = [[node_name(r, x) for x in names] if r in per_source else [r] for r in reads]
            out.append(Node(s.name, s, None, tuple(n for group in expanded for n in group)))
        elif any(r in per_source for r in reads):
            per_source.add(s.name)
            out.extend(
                Node(
                    node_name(s.name, x),
                    s,
                    x,
                    tuple(node_name(r, x) if r in per_source else r for r in reads)
                    + tuple(node_name(r, y) for y in names[:i] for r in s.reads_earlier),
                )
                for i, x in enumerate(names)
            )
        else:
            out.append(Node(s.name, s, None, reads))
    return out


def node(config: PipelineConfig, name: str) -> Node:
    for n in nodes(config):
        if n.name == name:
            return n
    raise KeyError(f"no stage {name!r} in this config's graph (stages: {[n.name for n in nodes(config)]})")


def node_config(config: PipelineConfig, source: str | None) -> PipelineConfig:
    """The config a node's stage (or a root) runs on: its source's own config, or the config as given."""
    return config if source is None else source_config(config, source)


def roots(config: PipelineConfig) -> dict[str, str]:
    """The fingerprints the enabled stages start from (`source[ko]` per source with several)."""
    wanted = sorted({split_name(r) for n in nodes(config) for r in n.reads if split_name(r)[0] in ROOTS}, key=str)
    return {node_name(base, x): ROOTS[base](node_config(config, x)) for base, x in wanted}


def upstream(config: PipelineConfig, name: str, inputs: Inputs) -> list[str]:
    """The keys (or root fingerprints) a stage's key chains from, in the order it reads them."""
    return [v.key if isinstance(v, StageResult) else str(v) for v in (inputs[r] for r in node(config, name).reads)]


def key_of(config: PipelineConfig, name: str, inputs: Inputs) -> str:
    """THE key of a stage's output: its name, VERSION, settings and the keys of what it reads."""
    n = node(config, name)
    return stage_key(
        n.stage.name, n.stage.version, upstream(config, name, inputs), n.stage.settings(node_config(config, n.source))
    )


def stage_inputs(config: PipelineConfig, name: str, inputs: Inputs) -> tuple[PipelineConfig, Inputs]:
    """What a node's stage code sees: its config, and its inputs under the names the stage reads
    (a source's node reads `save`, not `save[ko]`; a combining node keeps the node names, and so do
    a source's reads of earlier sources' nodes, which `BuildContext.per_source` gives)."""
    n = node(config, name)
    if n.source is None:
        return config, inputs
    own = {r: split_name(r)[0] for r in n.reads if split_name(r)[1] in (None, n.source)}
    return node_config(config, n.source), {own.get(r, r): inputs[r] for r in n.reads}


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
            plan or make_plan(detect(config.cache_dir, with_gpus=False), config, read_env()),
            stage_in,
            store,
            key,
            progress,
            on_progress,
            options or {},
        )
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


def summary(results: dict[str, StageResult]) -> dict[str, Any]:
    """The one-line result of a run: where the token store and sample index are, and counts. With
    several sources: `token_stores` by source (`token_store` is the first's), and the mix report
    under `mix`."""
    stores = {split_name(n)[1]: r for n, r in results.items() if split_name(n)[0] == tokenize.NAME}
    packed = results.get(pack.NAME) or results.get(mix.NAME)
    first = next(iter(stores.values()))
    out = {
        "token_store": first.path,
        "sample_index": packed.path if packed else None,
        "tokenizer": results["tokenizer"].path,
        "num_tokens": sum(r.report["tokens"] for r in stores.values()),
        "num_documents": sum(r.report["documents"] for r in stores.values()),
        "num_samples": packed.report["samples"] if packed else None,
        "stages": {
            name: {"key": r.key, "built": r.built}
            | {
                k: r.report[k]
                for k in (
                    "rows_in",
                    "rows_out",
                    "dropped",
                    "counts",
                    "tokens",
                    "samples",
                    "padding_fraction",
                    "documents_split",
                    "seconds",
                    "mb_per_s",
                    "warnings",
                )
                if k in r.report
            }
            | ({"repetition": _repetition(r.report)} if split_name(name)[0] == mix.NAME else {})
            for name, r in results.items()
        },
    }
    if mix.NAME in results:
        report = results[mix.NAME].report
        out["token_stores"] = {source: r.path for source, r in stores.items()}
        out["mix"] = {k: report[k] for k in ("total_tokens", "total_from", "tokens", "seq_len", "sources")}
    return out


def _repetition(mix_report: dict[str, Any]) -> dict[str, float]:
    """How many passes over its train windows each source gives (the mix report's `epochs`)."""
    return {s["name"]: s["epochs"] for s in mix_report.get("sources", [])}


def prepare(config: PipelineConfig, plan: Plan | None = None, progress: bool = True) -> dict[str, Any]:
    """Run every data stage (no Prefect) and return `summary`. transformers loads the tokenizer in
    another process meanwhile, for the tokenizer and tokenize stages' checks (`reference`)."""
    from moai.stages.tokenize import reference

    with reference.prefetch(config):
        return summary(walk(config, lambda name, inputs: run_stage(config, name, inputs, plan=plan, progress=progress)))


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


def launch_training(
    config: PipelineConfig,
    prepared: dict[str, Any],
    on_line: Callable[[str], None],
    on_metrics: Callable[[dict], None] | None = None,
    plan: Plan | None = None,
) -> dict[str, Any]:
    """Train on prepared data with `accelerate launch python -m moai.train`; return the last metrics.

    First `resume_plan` with everything known now (the GPUs, the prepared samples): a checkpoint
    made with other settings is a `ConfigError` before launch, and a finished run is not launched
    again (its last metrics are returned, with "status": "finished"). The whole output of the
    launch goes to `<output_dir>/logs/train-<time>.log`, named by a failure's one-line message."""
    from moai import launch
    from moai.errors import DataError
    from moai.train.checkpoint import resume_plan
    from moai.train.data import num_train_samples, sample_order_identity
    from moai.train.resolved import DataPaths

    t = config.train
    if t is None:
        raise DataError("no train section in the config: nothing to train")
    plan = plan or make_plan(detect(config.cache_dir, with_gpus=True), config, read_env())
    data = DataPaths.model_validate({k: prepared[k] for k in ("sample_index", "tokenizer", "token_store")})
    num_gpus = len(plan.hardware.gpus)
    decided = resume_plan(
        config,
        num_gpus=num_gpus,
        num_samples=num_train_samples(data, config.pack.seq_len),
        sample_order=sample_order_identity(data.sample_index),
    )
    log.info("train: %s", decided.detail)
    if decided.status == "finished":
        metrics = Path(t.output_dir) / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        return {**launch.last_metrics(lines), "status": "finished", "step": decided.step}
    resolved = launch.resolve(config, data, plan.loader_workers.value)
    cmd = launch.launch_command(
        t,
        str(resolved),
        num_gpus=num_gpus,
        port=launch.free_port(),
        accelerate_config=str(resolved.parent / "accelerate.yaml"),
    )
    log_file = launch.log_path(resolved.parent, t.machine_rank, t.num_machines)
    log.info("launching %d training process(es): %s", cmd.num_processes, " ".join(cmd.argv))
    log.info("the whole training output goes to %s", log_file)
    try:
        return launch.run_launch(cmd, on_line, on_metrics, log_file=log_file)
    except launch.TrainingFailed as err:  # the same error (its tail and log path), with the hint
        err.args = (with_damaged_data_hint(str(err), config.cache_dir, [data.sample_index, data.token_store]),)
        raise


# What a token store or sample index changed after it was published makes training fail with: ids
# past the embedding, windows past the tokens, rows of the wrong shape.
# (Not "must match the size of tensor": a model config with other head counts fails with it too.)
DAMAGED_DATA = re.compile(r"IndexError|index out of range|out of bounds|shape mismatch|device-side assert")


def with_damaged_data_hint(message: str, cache_dir: str, folders: list[str | None]) -> str:
    """A training failure's line; for one a damaged store can cause, with the folders it read and the
    check, before the log file (which stays last)."""
    if not DAMAGED_DATA.search(message):
        return message
    where = ", ".join(f for f in folders if f)
    hint = (
        f"if the data it read ({where}) was changed after it was built, `moai cache verify {cache_dir}` "
        "names the damaged folder (remove it and rerun to rebuild it)"
    )
    head, sep, log_file = message.rpartition("; full log: ")
    return f"{head}; {hint}{sep}{log_file}" if sep else f"{message}; {hint}"
