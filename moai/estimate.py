"""The validation split `moai plan` and `moai doctor` expect, from a sample of each source.

`sample_source` reads the first `SAMPLE_BYTES` of a local source (JSON-lines files, decompressed
as convert reads them, in its order), makes each row's text as convert does (`text_field`, `text_template`,
or a conversation rendered with its chat template), drops what filter drops, then what the cleaning
stages that are on drop (each stage's own verdicts on the sample's texts, in the chain's order:
`moai.stages.chain.judge_sample`; dedup finds the copies within the sample), and counts each
text's tokens as tokenize does (the given tokenizer, EOS included; with `tokenizer.train`, a
byte-level BPE of the asked vocabulary trained on the sample).

`validation` then takes the rows `moai.stages.save` would put in the validation split: exactly
those rows when the sample is the whole source, else as many rows as the source holds at the
sample's rows per byte, their lengths drawn from the sample. The samples are counted with pack's
own functions (concat windows, best-fit rows). It says why the number may be far off (`rough`):
dedup on part of a source (copies of rows past the sample are not seen); cleaning of chat rows
(the stages judge the messages as JSON, the sample holds them rendered); a tokenizer trained on
all of the text; a handful of validation rows that the sample does not name; a source it could
not sample.

Cost: reading and tokenizing 4 MiB with the Rust tokenizer (~0.3 s on one core), or training the
BPE on it (~1-2 s); the split and the packing are NumPy over the sample's lengths. Cleaning adds
the stages' own cost on the sample (MB/s in the stage table), and with `language` the fastText
model's load.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moai.config import PipelineConfig, SourceConfig
from moai.stages.convert.compressed import format_suffix

log = logging.getLogger(__name__)

SAMPLE_BYTES = 4 << 20
# A source whose validation split holds this many samples by its size alone (`preflight`'s
# bytes-based guess), with no cleaning stage on, is sampled over its first QUICK_SAMPLE_BYTES only:
# the count is then informative (it cannot come near the "0 samples" warning), and tokenizing 4 MiB
# with a 131k vocabulary was ~0.3 s of every cold prepare (~700 samples from 1 MiB against ~693 from
# 4 MiB on the 601 MB benchmark corpus).
MANY_SAMPLES = 100
QUICK_SAMPLE_BYTES = 1 << 20
FEW_ROWS = 30  # fewer validation rows than this, not known one by one: their own lengths decide the count


@dataclass(frozen=True)
class SourceSample:
    """A source's first rows as tokenize will see them."""

    lengths: np.ndarray  # tokens of each row filter keeps (EOS included), in source order
    bytes_read: int  # source bytes those rows (and the rows skipped among them) take
    whole: bool  # the sample is every row of the source
    trained: bool  # counted with a BPE trained on the sample (tokenizer.train), not the final tokenizer
    dropped: dict[str, int] = field(default_factory=dict)  # rows each cleaning stage drops from the sample
    rough: tuple[str, ...] = ()  # why the sample's rows may be far from those prepare keeps

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_read / max(1, int(self.lengths.sum()))


@dataclass(frozen=True)
class Estimate:
    tokens: int
    samples: int
    rows: int
    rough: tuple[str, ...] = ()  # why it may be far off; empty: expected within ~20%


def sample_source(
    files: list, src: SourceConfig, config: PipelineConfig, limit: int = SAMPLE_BYTES
) -> SourceSample | str:
    """The sample of a source's files (local plain `.jsonl` only, in order, up to `limit` bytes),
    or why there is none."""
    texts, used, whole = [], 0, True
    for path in files:
        if not isinstance(path, Path) or format_suffix(path) != ".jsonl" or used >= limit:
            whole = False
            break
        head = _read(path, limit - used + 1)
        lines = head.split(b"\n")
        if len(head) > limit - used:  # cut short: the last line is partial
            lines, whole = lines[:-1], False
        for raw in lines:
            used += len(raw) + 1
            text = _text_of(raw, src, config)
            if text is not None:
                texts.append(text)
        if not whole:
            break
    texts = _filtered(texts, config)
    texts, dropped, rough = _cleaned(texts, src, config, whole)
    if not texts and dropped:
        return f"the cleaning stages drop every row of its first {limit >> 20 or 1} MiB ({_counts(dropped)})"
    if not texts:
        first = files[0] if files else None
        if not isinstance(first, Path) or format_suffix(first) != ".jsonl":
            return "only local .jsonl files are sampled"
        return f"no row of its first {limit >> 20 or 1} MiB was read as a text that filter keeps"
    lengths = _token_counts(texts, src, config)
    if lengths is None:
        return "no tokenizer.json to count tokens with"
    return SourceSample(lengths, used, whole, config.tokenizer.path is None, dropped, rough)


def sample_limit(source_bytes: int, config: PipelineConfig) -> int:
    """How much of a source of `source_bytes` to sample: SAMPLE_BYTES, or QUICK_SAMPLE_BYTES for a
    large source with a given tokenizer (not one trained on the sample) and no cleaning stage on
    (see MANY_SAMPLES)."""
    from moai.preflight import validation_estimate
    from moai.stages.chain import CHAIN

    if config.tokenizer.path is None or any(is_on(config) for _, is_on in CHAIN[1:]):
        return SAMPLE_BYTES
    guess = validation_estimate(source_bytes, config.split.val_fraction, config.pack.seq_len)
    return QUICK_SAMPLE_BYTES if guess is not None and guess[1] >= MANY_SAMPLES else SAMPLE_BYTES


def _cleaned(
    texts: list[str], src: SourceConfig, config: PipelineConfig, whole: bool
) -> tuple[list[str], dict[str, int], tuple[str, ...]]:
    """What the cleaning stages that are on keep of the sample, the rows each drops, and why that
    may be far from what they keep of the source."""
    from moai.stages.chain import CHAIN, judge_sample

    names = [name for name, is_on in CHAIN[1:] if is_on(config)]
    if not names:
        return texts, {}, ()
    if src.format == "chat":  # the stages judge the messages as JSON; the sample holds them rendered
        return texts, {}, (f"{', '.join(names)} drop chat rows before the split that the plan does not count",)
    kept, dropped = judge_sample(config, texts)
    rough = () if whole or "dedup" not in names else ("dedup on a sample sees only the copies within it",)
    return kept, dropped, rough


def _counts(dropped: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in dropped.items())


def _read(path: Path, size: int) -> bytes:
    """The first `size` bytes of the file's text, decompressed as convert reads it (by its magic number)."""
    from moai.stages.convert.compressed import codec_of, decompressing, read_head

    codec = codec_of(path, read_head(path))
    with open(path, "rb") as raw:
        return (decompressing(raw, codec) if codec else raw).read(size)


def _text_of(raw: bytes, src: SourceConfig, config: PipelineConfig) -> str | None:
    """The row's text as convert makes it; a chat row rendered with its template; None for a row convert skips."""
    try:
        row = json.loads(raw)
        if src.format == "chat":
            return _render(row[src.messages_field], src, config)
        text = row[src.text_field] if src.text_field is not None else (src.text_template or "").format_map(row)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return text if isinstance(text, str) else None


def _filtered(texts: list[str], config: PipelineConfig) -> list[str]:
    """What filter keeps (`moai.stages.filter.reason_masks`: the stripped text's length in characters)."""
    lo, hi = max(1, config.filter.min_chars), config.filter.max_chars
    return [t for t in texts if lo <= len(t.strip()) and (hi is None or len(t.strip()) <= hi)]


def _token_counts(texts: list[str], src: SourceConfig, config: PipelineConfig) -> np.ndarray | None:
    from moai.stages.tokenizer import rust_tokenizer_file, train_bpe

    if config.tokenizer.path is not None:
        file = Path(config.tokenizer.path).expanduser() / "tokenizer.json"
        if not file.is_file():
            return None
        from moai.stages.tokenize.engines import file_counts

        counts = file_counts(file, texts, add_special_tokens=src.format != "chat")
        if counts is not None:  # fastokens built it ahead (`reference.prefetch`): no second load
            return counts + 1  # + EOS
        tok = rust_tokenizer_file(file)
    else:
        assert config.tokenizer.train is not None
        t = config.tokenizer.train
        tok = train_bpe(iter([texts]), t.vocab_size, t.min_frequency, length=len(texts))
    # the ids of encode_batch without the offsets, which the count does not need (~20% less time)
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    encoded = encode(texts, add_special_tokens=src.format != "chat")
    return np.fromiter((len(e.ids) + 1 for e in encoded), dtype=np.int64, count=len(texts))  # + EOS


def _render(messages: Any, src: SourceConfig, config: PipelineConfig) -> str:
    """A conversation rendered as transformers renders it (the same Jinja settings), for counting only."""
    from moai.stages.tokenize.chat import load_template

    template, specials = load_template(src.chat_template), _special_tokens(config)
    template = template or specials.pop("chat_template", None)
    if not template:
        raise ValueError("no chat template")
    return _jinja(template).render(messages=messages, add_generation_prompt=False, **specials)


def _special_tokens(config: PipelineConfig) -> dict[str, Any]:
    path = Path(config.tokenizer.path or "").expanduser() / "tokenizer_config.json"
    if config.tokenizer.path is None or not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    out = {k: v for k, v in data.items() if k.endswith("_token") and isinstance(v, str)}
    if isinstance(data.get("chat_template"), str):
        out["chat_template"] = data["chat_template"]
    return out


_TEMPLATES: dict[str, Any] = {}


def _jinja(template: str):
    if template not in _TEMPLATES:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        _TEMPLATES[template] = env.from_string(template)
    return _TEMPLATES[template]


def validation(sample: SourceSample, source_bytes: int, config: PipelineConfig) -> Estimate:
    """The validation split of one source: its tokens, its packed samples and its rows."""
    from moai.stages.save import num_validation_rows, validation_rows

    lengths, split = sample.lengths, config.split
    rough = list(sample.rough)
    if sample.whole:
        val = lengths[validation_rows(len(lengths), split)]
        rows, scale = len(val), 1.0
    else:
        rows = num_validation_rows(round(len(lengths) * source_bytes / max(1, sample.bytes_read)), split)
        if rows <= len(lengths):
            draw = np.random.default_rng(split.seed).choice(len(lengths), size=rows, replace=False)
            val, scale = lengths[np.sort(draw)], 1.0
        else:  # more validation rows than the sample holds: the sample's split, scaled
            val, scale = lengths, rows / len(lengths)
        if rows < FEW_ROWS:
            rough.append(f"only ~{rows} validation rows, drawn from a sample: which rows they are decides it")
        if sample.trained:
            rough.append("prepare trains the tokenizer on all the text; counted with one trained on a sample")
    return Estimate(int(val.sum() * scale), int(packed(val, config) * scale), rows, tuple(rough))


def packed(lengths: np.ndarray, config: PipelineConfig) -> int:
    """How many samples pack makes of documents of these lengths (one split of one source)."""
    from moai.stages.pack import best_fit, concat_chunk

    if config.pack.mode == "best_fit":
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return len(best_fit(offsets, config.pack.seq_len)[1]) - 1
    return len(concat_chunk(int(lengths.sum()), config.pack.seq_len, config.pack.drop_remainder))
