"""One source or several: the names, each source's own single-source config, and the mix's budget.

With `sources:` every source runs its own chain of stages (convert → filter → save → tokenize) on
the config `source_config` derives for it: the same config with that one source as `source:`.
Its keys are therefore the keys a single-source config of that source would have, so adding a
source or changing a weight rebuilds none of the others, and a source moved from `source:` into
`sources:` reuses its cache.
"""

from __future__ import annotations

from fractions import Fraction

from moai.config import MixConfig, NamedSourceConfig, PipelineConfig


def source_names(config: PipelineConfig) -> list[str] | None:
    """The names of the sources, in config order; None for a single `source:`."""
    return None if config.sources is None else [s.name for s in config.sources]


def named(config: PipelineConfig, name: str) -> NamedSourceConfig:
    for s in config.sources or ():
        if s.name == name:
            return s
    raise KeyError(f"no source named {name!r} (sources: {source_names(config)})")


def source_config(config: PipelineConfig, name: str) -> PipelineConfig:
    """The config of source `name` alone, as if it were the config's only `source:`."""
    return config.model_copy(update={"source": named(config, name).source(), "sources": None, "mix": MixConfig()})


def shares(config: PipelineConfig) -> list[Fraction]:
    """Each source's weight normalised to a share of 1, exactly (the weights' binary values)."""
    weights = [Fraction(s.weight) for s in config.sources or ()]
    total = sum(weights, Fraction(0))
    return [w / total for w in weights]


def world_size(config: PipelineConfig, num_gpus: int) -> int:
    """The training processes a launch will start (as `moai.launch.launch_command` counts them)."""
    t = config.train
    assert t is not None
    return (t.num_processes or max(1, num_gpus)) * t.num_machines


def train_tokens(config: PipelineConfig, num_gpus: int) -> int:
    """The tokens a training run reads: max_steps × micro_batch_size × grad_accum_steps × world size × seq_len."""
    t = config.train
    assert t is not None
    return t.max_steps * t.micro_batch_size * t.grad_accum_steps * world_size(config, num_gpus) * config.pack.seq_len


def needs_gpu_count(config: PipelineConfig) -> bool:
    """Whether the mix's total depends on how many GPUs this machine has."""
    t = config.train
    return config.mix.total_tokens is None and t is not None and t.enabled and t.num_processes is None


def total_tokens(config: PipelineConfig, num_gpus: int = 0) -> tuple[int | None, str]:
    """The mix's token budget and where it comes from; None: as many as every source's cap allows."""
    if config.mix.total_tokens is not None:
        return config.mix.total_tokens, "mix.total_tokens"
    t = config.train
    if t is not None and t.enabled:
        ws = world_size(config, num_gpus)
        why = (
            f"train: max_steps {t.max_steps} × micro_batch_size {t.micro_batch_size} × grad_accum_steps "
            f"{t.grad_accum_steps} × world size {ws} × seq_len {config.pack.seq_len}"
        )
        return train_tokens(config, num_gpus), why
    return None, "neither mix.total_tokens nor train is set: as many tokens as every source's max_repetition allows"
