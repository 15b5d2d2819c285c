"""What `moai.launch` hands the training processes: `resolved.json`, as a typed model.

`moai.launch.resolve` writes a `ResolvedRun` (the pipeline config, with an absolute
train.output_dir, plus where the prepared data is); each training process reads it back with
`ResolvedRun.read`, which validates it like the user's config: an unknown or a missing key is an
error naming the file and the key, so a launcher and a trainer that disagree fail at start instead
of training on a setting silently dropped. Reading costs one small JSON parse.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from moai.config import ConfigError, PipelineConfig, TrainConfig


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataPaths(_Model):
    """Where the prepared data is: the stage outputs the training processes read."""

    token_store: str = Field(description="The tokenize stage's token store folder.")
    sample_index: str | None = Field(description="The pack stage's sample index folder; None: unpacked training.")
    tokenizer: str = Field(description="The tokenizer folder; saved with every checkpoint and the final model.")


class ResolvedRun(_Model):
    """Everything one training process needs: the whole config, the data paths, the loader's workers."""

    config: PipelineConfig
    data: DataPaths
    loader_workers: int = Field(ge=0, description="DataLoader worker processes per rank (from the hardware plan).")

    @model_validator(mode="after")
    def _has_train(self) -> ResolvedRun:
        if self.config.train is None:
            raise ValueError("config.train is missing: nothing to train")
        return self

    @property
    def train(self) -> TrainConfig:
        assert self.config.train is not None  # checked by _has_train
        return self.config.train

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.model_dump_json(indent=2, by_alias=True))
        return path

    @classmethod
    def read(cls, path: str | Path) -> ResolvedRun:
        """Read and validate a resolved.json; `ConfigError` names the file and every bad key."""
        path = Path(path)
        try:
            return cls.model_validate_json(path.read_bytes())
        except ValidationError as err:
            problems = []
            for e in err.errors():
                where = ".".join(str(p) for p in e["loc"]) or "(top level)"
                problems.append(f"{where}: unknown key" if e["type"] == "extra_forbidden" else f"{where}: {e['msg']}")
            raise ConfigError(f"{path}: {'; '.join(problems)}") from None
