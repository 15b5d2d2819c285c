"""Which encoder the tokenize stage runs, checked against transformers before anything is written.

A sample of the corpus (`sample_texts`) is encoded by transformers itself (`tokenizer(texts)`):
those are the ids to match. tiktoken is used when it can express the tokenizer and gives exactly
those ids on every sampled document, else the `tokenizers` backend, which must match too or
nothing is written (`choose_engine`). Giant documents are encoded in pieces only when the cut
rule gives the same ids on the sample (`check_pieces`, see `pieces`).

`EncoderSetup` is what a process needs to build the chosen encoder; `init_encoder` builds it in
this process (a worker, or the main process) into `state`, which `parts` encodes with.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moai.errors import TokenizerError
from moai.formats.text import open_split_table, row_bytes, text_bytes
from moai.stages.tokenize import pieces
from moai.stages.tokenize.tiktoken import NotExpressible, TiktokenSpec, spec_from_tokenizer_json
from moai.stages.tokenizer import TokenizerInfo, loaded_tokenizer

log = logging.getLogger("moai.stages.tokenize")  # the stage's log lines keep the stage's name

# tiktoken must match tokenizers exactly on up to this many documents / bytes spread over the corpus
VERIFY_DOCUMENTS = 2000
VERIFY_BYTES = 2 << 20
VERIFY_DOCUMENT_BYTES = 64 << 10  # a sampled document is cut to this much text (giant documents)


Reference = Callable[[list[str]], list[list[int]]]


def transformers_reference(info: TokenizerInfo) -> Reference:
    """`tokenizer(texts)["input_ids"]` of the tokenizer as transformers loads it: the ids we must match."""
    tok = loaded_tokenizer(info.path, info.trust_remote_code)
    return lambda texts: tok(texts, verbose=False)["input_ids"] if texts else []


def _first_mismatch(encode: pieces.Encode, want: list[list[int]], sample: list[str]) -> int | None:
    for i, (a, b) in enumerate(zip(encode(sample, True), want, strict=True)):
        if list(a) != list(b):
            return i
    return None


Built = dict[bool, pieces.Encode]  # the encoders built while checking, by "is it tiktoken"


def _encoder(info: TokenizerInfo, spec: TiktokenSpec | None, threads: int, built: Built | None) -> pieces.Encode:
    """The encoder for `spec`, built once per check (building tiktoken's ranks takes a while)."""
    if built is not None and (spec is not None) in built:
        return built[spec is not None]
    encode = pieces.make_encoder(info.backend_json, info.split_special_tokens, spec, threads)
    if built is not None:
        built[spec is not None] = encode
    return encode


def choose_engine(
    requested: str,
    info: TokenizerInfo,
    sample: list[str],
    threads: int,
    want: list[list[int]],
    built: Built | None = None,
) -> tuple[TiktokenSpec | None, str]:
    """(tiktoken spec or None for tokenizers, reason). An engine is used only when its ids equal
    `want` (transformers' ids of the sample) on every sampled document; when not even `tokenizers`
    does, nothing is written. `built` keeps the encoders made here for `check_pieces` and the run."""
    spec, reason = None, "tokenize.engine is tokenizers"
    if requested != "tokenizers":
        try:
            spec = spec_from_tokenizer_json(info.backend_json, info.split_special_tokens)
        except NotExpressible as err:
            reason = f"tiktoken cannot express this tokenizer ({err}); using tokenizers"
            log.log(logging.WARNING if requested == "tiktoken" else logging.INFO, reason)
    if spec is not None:
        bad = _first_mismatch(_encoder(info, spec, threads, built), want, sample)
        if bad is None:
            reason = f"tiktoken matches transformers on all {len(sample)} sampled documents"
            log.info(reason)
            return spec, reason
        reason = (
            f"tiktoken ids differ from transformers on sample document {bad} ({sample[bad][:60]!r}); using tokenizers"
        )
        log.warning(reason)
    bad = _first_mismatch(_encoder(info, None, threads, built), want, sample)
    if bad is not None:
        raise TokenizerError(
            f"tokenizer {info.name_or_path!r}: moai's encoder gives other ids than transformers on sample document "
            f"{bad} ({sample[bad][:60]!r}); nothing was written. Please report this tokenizer to moai."
        )
    return None, reason


def check_pieces(
    spec: TiktokenSpec | None,
    info: TokenizerInfo,
    sample: list[str],
    threads: int,
    want: list[list[int]],
    built: Built | None = None,
) -> str | None:
    """None when giant documents can be encoded in pieces with exact ids (checked on the sample),
    else why they will be encoded whole."""
    encode = _encoder(info, spec, threads, built)
    bad = pieces.check_cut_rule(encode, sample, want)
    if bad is not None:
        log.warning(
            "documents over %d MiB will be encoded whole (memory grows with them): %s",
            pieces.LARGE_DOCUMENT_BYTES >> 20,
            bad,
        )
    return bad


def sample_texts(
    text_dir: Path, n: int = VERIFY_DOCUMENTS, max_bytes: int = VERIFY_BYTES, doc_bytes: int = VERIFY_DOCUMENT_BYTES
) -> list[str]:
    """Up to n documents (about max_bytes of text, each cut to doc_bytes) spread over the train split."""
    table = open_split_table(text_dir, "train")
    if table.num_rows == 0:
        return []
    sizes = np.minimum(text_bytes(table), doc_bytes)
    mean = max(1.0, float(sizes.mean()))
    n = max(1, min(n, table.num_rows, int(max_bytes / mean)))
    rows = np.unique(np.linspace(0, table.num_rows - 1, num=n).astype(np.int64))
    # Row by row from the mapped buffers: `take` on a chunked string column concatenates the
    # chunks first, and `as_py` would copy a whole giant document; this reads doc_bytes at most.
    column = table.column(0)
    return [_utf8_prefix(row_bytes(column, int(r)), doc_bytes) for r in rows]


def _utf8_prefix(data, limit: int) -> str:
    """The first `limit` bytes of UTF-8 text, cut back to a character boundary."""
    arr = np.frombuffer(data, dtype=np.uint8)
    end = min(limit, len(arr))
    while 0 < end < len(arr) and arr[end] & 0xC0 == 0x80:
        end -= 1
    return arr[:end].tobytes().decode("utf-8")


@dataclass(frozen=True)
class EncoderSetup:
    """What a process needs to build its encoder; small and picklable."""

    backend_json: str
    split_special_tokens: bool
    spec: TiktokenSpec | None
    threads: int
    pieces_exact: bool  # may giant documents be encoded in pieces (checked on the sample; False when there are none)?


# Per-process state: the encoder, the piece encoder, opened tables and giant-document counts. Set
# by `init_encoder` in a worker, or in the main process; `parts` encodes and counts with it.
state: dict[str, Any] = {}


def init_encoder(
    setup: EncoderSetup,
    rayon_threads: int | None = None,
    warm_up: list[str] | None = None,
    spawned_at: float | None = None,
    encode: pieces.Encode | None = None,
) -> None:
    """Set up this process's encoder (or take `encode`, one already built for `setup`), then
    encode the warm-up texts once (thread pools, caches) so timing starts warm. `spawned_at`
    (`time.time()` when the parent started the pool): a worker records its start-up, which its
    first part's profile reports."""
    t0 = time.perf_counter()
    if rayon_threads is not None:
        # Read by Rayon when its pool first starts, which is after this in a fresh worker.
        os.environ["RAYON_NUM_THREADS"] = str(rayon_threads)
    if encode is None:
        encode = pieces.make_encoder(setup.backend_json, setup.split_special_tokens, setup.spec, setup.threads)
    state["encode"] = encode
    # tiktoken's encoder can also hand each document's ids over as an array (`encode_arrays`):
    # the parts use that, the checks and the piece encoder keep the lists of `encode`.
    state["encode_arrays"] = getattr(getattr(encode, "__self__", None), "encode_arrays", None)
    state["pieces"] = pieces.PieceEncoder(encode) if setup.pieces_exact else None
    state["tables"] = {}
    state["forced_cuts"] = 0
    state["large_documents"] = 0
    if warm_up:
        encode(warm_up, True)
    state["startup"] = {
        "setup": round(time.perf_counter() - t0, 4),  # encoder build and warm-up
        "startup": round(time.time() - spawned_at, 4) if spawned_at is not None else 0.0,  # spawn, imports, setup
    }


def clear_encoder() -> None:
    """Drop this process's encoder and table maps."""
    state.clear()


@dataclass(frozen=True)
class EngineChoice:
    """The checked encoder set-up for a corpus, why, and the sample it was checked on."""

    setup: EncoderSetup
    engine_reason: str
    pieces_reason: str | None  # why giant documents are encoded whole, or None (in exact pieces)
    sample: list[str]
    encode: pieces.Encode | None = field(default=None, repr=False, compare=False)  # built for `setup`

    @property
    def engine(self) -> str:
        return "tiktoken" if self.setup.spec is not None else "tokenizers"


def has_large_documents(text_dir: Path) -> bool:
    """Does any split hold a document over `pieces.LARGE_DOCUMENT_BYTES` (encoded in pieces)?"""
    for split in ("train", "validation"):
        table = open_split_table(text_dir, split)
        if table.num_rows and int(text_bytes(table).max()) > pieces.LARGE_DOCUMENT_BYTES:
            return True
    return False


def choose_encoder(info: TokenizerInfo, text_dir: Path, requested: str, threads: int) -> EngineChoice:
    """Sample the corpus, choose the engine, check it against transformers, and the piece rule too
    when the corpus has a document large enough to be encoded in pieces (else the rule is never
    used, and checking it would cost ~0.3-0.6 s of every run for nothing)."""
    sample = sample_texts(text_dir)
    want = transformers_reference(info)(sample)
    built: Built = {}
    spec, reason = choose_engine(requested, info, sample, threads, want, built)
    large = has_large_documents(text_dir)
    pieces_reason = check_pieces(spec, info, sample, threads, want, built) if large else None
    setup = EncoderSetup(info.backend_json, info.split_special_tokens, spec, threads, large and pieces_reason is None)
    return EngineChoice(setup, reason, pieces_reason, sample, built[spec is not None])
