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
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from moai.config import PipelineConfig, read_env
from moai.hardware import Plan, detect, plan as make_plan
from moai.presets import config_origin
from moai.stages import convert, filter as filter_stage, pack, save, tokenize, tokenizer
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
        )


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


# Roots: what keys start from. Each reads content (it may take a while on a large corpus).
ROOTS: dict[str, Callable[[PipelineConfig], str]] = {
    "source": lambda config: convert.source_fingerprint(config.source),
    "tokenizer-files": lambda config: tokenizer.tokenizer_fingerprint(config.tokenizer),
}

REGISTRY: list[Stage] = [Stage.of(m) for m in (convert, filter_stage, save, tokenizer, tokenize, pack)]


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


def roots(config: PipelineConfig) -> dict[str, str]:
    """The fingerprints the enabled stages start from."""
    return {r: ROOTS[r](config) for r in sorted({r for s in stages(config) for r in s.reads(config) if r in ROOTS})}


def upstream(config: PipelineConfig, name: str, inputs: Inputs) -> list[str]:
    """The keys (or root fingerprints) a stage's key chains from, in the order it reads them."""
    return [v.key if isinstance(v, StageResult) else str(v) for v in (inputs[r] for r in stage(name).reads(config))]


def key_of(config: PipelineConfig, name: str, inputs: Inputs) -> str:
    """THE key of a stage's output: its name, VERSION, settings and the keys of what it reads."""
    s = stage(name)
    return stage_key(s.name, s.version, upstream(config, name, inputs), s.settings(config))


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
    s = stage(name)
    store = Store(config.cache_dir, origin=config_origin(config))
    key = key_of(config, name, inputs)
    ups, settings = upstream(config, name, inputs), s.settings(config)

    def build(out: Path) -> dict[str, Any]:
        ctx = BuildContext(
            config,
            plan or make_plan(detect(config.cache_dir, with_gpus=False), config, read_env()),
            inputs,
            store,
            key,
            progress,
            on_progress,
            options or {},
        )
        return s.build(ctx, out)

    pub = store.build(name, key, build, manifest={"upstream": ups, "settings": settings, "version": s.version})
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
    for s in stages(config):
        out[s.name] = results[s.name] = run(s.name, {r: results[r] for r in s.reads(config)})
        if s.name == until:
            break
    return out


def is_published(config: PipelineConfig, name: str, inputs: Inputs) -> bool:
    return Store(config.cache_dir).exists(name, key_of(config, name, inputs))


def summary(results: dict[str, StageResult]) -> dict[str, Any]:
    """The one-line result of a run: where the token store and sample index are, and counts."""
    tokens = results["tokenize"]
    packed = results.get("pack")
    return {
        "token_store": tokens.path,
        "sample_index": packed.path if packed else None,
        "tokenizer": results["tokenizer"].path,
        "num_tokens": tokens.report["tokens"],
        "num_documents": tokens.report["documents"],
        "num_samples": packed.report["samples"] if packed else None,
        "stages": {
            name: {"key": r.key, "built": r.built}
            | {
                k: r.report[k]
                for k in ("rows_in", "rows_out", "dropped", "tokens", "samples", "seconds")
                if k in r.report
            }
            for name, r in results.items()
        },
    }


def prepare(config: PipelineConfig, plan: Plan | None = None, progress: bool = True) -> dict[str, Any]:
    """Run every data stage (no Prefect) and return `summary`."""
    return summary(walk(config, lambda name, inputs: run_stage(config, name, inputs, plan=plan, progress=progress)))


def merge(config: PipelineConfig, num_shards: int | None = None) -> dict[str, Any]:
    """Publish the token store from tokenize-shard units, then the rest of the graph; return `summary`."""
    options = {"num_shards": num_shards or 0}  # 0: merge without naming the missing shards' indices
    return summary(
        walk(
            config,
            lambda name, inputs: run_stage(
                config, name, inputs, progress=False, options=options if name == "tokenize" else None
            ),
        )
    )


def tokenize_shard(config: PipelineConfig, shard_index: int, num_shards: int) -> dict[str, Any]:
    """One unit of the tokenize stage (see `moai.stages.tokenize.units`): the stages before it, then its parts."""
    done = walk(config, until=tokenizer.NAME)
    inputs = {r: done[r] for r in stage(tokenize.NAME).reads(config)}
    return tokenize.run_unit(
        config, key_of(config, tokenize.NAME, inputs), inputs, shard_index=shard_index, num_shards=num_shards
    )


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
    from moai.train.data import num_train_samples
    from moai.train.resolved import DataPaths

    t = config.train
    if t is None:
        raise DataError("no train section in the config: nothing to train")
    plan = plan or make_plan(detect(config.cache_dir, with_gpus=True), config, read_env())
    data = DataPaths.model_validate({k: prepared[k] for k in ("sample_index", "tokenizer", "token_store")})
    num_gpus = len(plan.hardware.gpus)
    decided = resume_plan(config, num_gpus=num_gpus, num_samples=num_train_samples(data, config.pack.seq_len))
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
    return launch.run_launch(cmd, on_line, on_metrics, log_file=log_file)
