"""One config tree for the whole pipeline.

`PipelineConfig` is made of one small model per stage. Every model forbids unknown keys, so a
typo in a user's file is an error that names the key instead of a setting silently ignored.
Environment variables are read here and nowhere else (`read_env`).

The sections live beside this module, one per concern (`sources`, `text`, `tokens`, `run`);
every name is imported from `moai.config` itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from moai.config.base import _Model
from moai.config.run import ResourcesConfig, RunnerConfig, TrainConfig
from moai.config.sources import MixConfig, NamedSourceConfig, SourceConfig, template_fields
from moai.config.text import (
    DecontaminateConfig,
    DedupConfig,
    FilterConfig,
    LanguageConfig,
    NearDedupConfig,
    QualityConfig,
    SaveConfig,
    SplitConfig,
)
from moai.config.tokens import PackConfig, TokenizeConfig, TokenizerConfig, TokenizerTrainConfig
from moai.errors import ConfigError

# re-exported: config errors are raised here and caught as moai.config.ConfigError; each section by its name
__all__ = [
    "ENV_SETTINGS",
    "ConfigError",
    "DecontaminateConfig",
    "DedupConfig",
    "FilterConfig",
    "LanguageConfig",
    "MixConfig",
    "NamedSourceConfig",
    "NearDedupConfig",
    "PackConfig",
    "PipelineConfig",
    "QualityConfig",
    "ResourcesConfig",
    "RunnerConfig",
    "SaveConfig",
    "SourceConfig",
    "SplitConfig",
    "TokenizeConfig",
    "TokenizerConfig",
    "TokenizerTrainConfig",
    "TrainConfig",
    "load_config",
    "parse_config",
    "read_env",
    "template_fields",
]


class PipelineConfig(_Model):
    """Everything one run needs, from raw source to packed samples."""

    cache_dir: str = Field(".moai", description="Where every stage output lives.")
    remote_cache: str | None = Field(
        None,
        description="An fsspec URL (s3://bucket/prefix) that mirrors the store: pulled on a local miss, "
        "pushed after each publish; machines sharing it share every stage by key.",
    )
    remote_cache_options: dict[str, Any] = Field(
        default_factory=dict,
        description="The remote cache's storage options (endpoint_url, profile, anon); credentials come "
        "from the environment, never from here.",
    )
    source: SourceConfig | None = Field(None, description="One source (or `sources:` for several).")
    sources: list[NamedSourceConfig] | None = Field(None, description="Several named sources, mixed by weight.")
    mix: MixConfig = MixConfig()
    filter: FilterConfig = FilterConfig()
    dedup: DedupConfig | None = Field(None, description="Exact and near-duplicate removal (None: off).")
    quality: QualityConfig | None = Field(None, description="Heuristic quality rules (None: off).")
    language: LanguageConfig | None = Field(None, description="Keep only some languages (None: off).")
    decontaminate: DecontaminateConfig | None = Field(None, description="Drop texts leaking evaluation sets.")
    keep_dropped: bool = Field(
        False, description="Every row a cleaning stage drops, with its reason, in <stage output>/dropped/."
    )
    split: SplitConfig = SplitConfig()
    save: SaveConfig = SaveConfig()
    tokenizer: TokenizerConfig
    tokenize: TokenizeConfig = TokenizeConfig()
    pack: PackConfig = PackConfig()
    resources: ResourcesConfig = ResourcesConfig()
    runner: RunnerConfig = RunnerConfig()
    train: TrainConfig | None = Field(None, description="The training step; None: prepare data only.")

    @model_validator(mode="after")
    def _one_kind_of_source(self) -> PipelineConfig:
        from moai.remote import is_url, refuse_secrets

        refuse_secrets(self.remote_cache_options, "remote_cache_options")
        if self.remote_cache is not None and not is_url(self.remote_cache):
            raise ValueError(f"remote_cache {self.remote_cache!r} is not a URL: give one such as s3://bucket/prefix")
        if (self.source is None) == (self.sources is None):
            raise ValueError("set exactly one of source (one source) or sources (a list of named sources)")
        if self.sources is not None:
            names = [s.name for s in self.sources]
            if not names:
                raise ValueError("sources: give at least one source")
            repeated = sorted({n for n in names if names.count(n) > 1})
            if repeated:
                raise ValueError(f"sources: names must be unique, {repeated} repeated")
            if not self.pack.enabled:
                raise ValueError("pack.enabled: false trains on one token store; with sources the mix stage packs")
        elif self.mix != MixConfig():
            raise ValueError("mix is for sources (several named sources); with one source there is nothing to mix")
        return self


def _keys_at(loc: tuple) -> list[str]:
    """The keys the config accepts beside the last part of `loc` (a validation error's location)."""
    import typing

    model: Any = PipelineConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # an item of a list: the list's model is found from its field
        field = model.model_fields.get(part) or next((f for f in model.model_fields.values() if f.alias == part), None)
        if field is None:
            return []
        found = [
            a
            for t in (field.annotation, *typing.get_args(field.annotation))
            for a in (t, *typing.get_args(t))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if not found:
            return []
        model = found[0]
    return [f.alias or name for name, f in model.model_fields.items()]


def _describe(err: ValidationError) -> str:
    import difflib

    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(e["loc"][-1]), _keys_at(tuple(e["loc"])), n=1, cutoff=0.6)
            lines.append(f"{where}: unknown key" + (f" (did you mean {close[0]}?)" if close else ""))
        else:
            lines.append(f"{where}: {e['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)


def parse_config(data: Any, origin: str = "config") -> PipelineConfig:
    """Validate a plain dict into a `PipelineConfig`, with errors that name `origin` and the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{origin}: {_describe(err)}") from None


def load_config(path: str | os.PathLike) -> PipelineConfig:
    """Read a YAML or JSON config file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except (json.JSONDecodeError, Exception) as err:  # yaml.YAMLError has no common import here
        raise ConfigError(f"{path}: cannot parse: {err}") from None
    return parse_config(data, origin=str(path))


ENV_SETTINGS = {
    "DATASET_NUM_PROC": "num_proc",
    "DATASET_BATCH_SIZE": "batch_size",
    "DATASET_WRITER_BATCH_SIZE": "writer_batch_size",
}


def read_env(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """Resource settings given through the environment (the only place moai reads it)."""
    environ = os.environ if environ is None else environ
    found: dict[str, int] = {}
    for var, key in ENV_SETTINGS.items():
        raw = environ.get(var)
        if raw is None or raw.strip() == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"environment variable {var}={raw!r}: expected a positive integer") from None
        if value < 1:
            raise ConfigError(f"environment variable {var}={raw!r}: expected a positive integer")
        found[key] = value
    return found
