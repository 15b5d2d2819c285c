"""Where the documents come from: `source:`, `sources:` (named, weighted) and their `mix:`."""

from __future__ import annotations

import functools
import string
from typing import Any, Literal

from pydantic import Field, model_validator

from moai.config.base import _Model


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
