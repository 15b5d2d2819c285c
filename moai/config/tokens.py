"""The token stages' settings: the tokenizer (given or trained), tokenize and pack."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from moai.config.base import _Model


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
