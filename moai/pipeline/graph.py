"""The stage table: every stage declared once (`REGISTRY`), the roots keys start from (`ROOTS`),
the graph of nodes a config enables, and the one function that computes a key (`key_of`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from moai.config import PipelineConfig
from moai.hardware import Plan
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
