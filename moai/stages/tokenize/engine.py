"""Which encoder the tokenize stage runs, checked against transformers before anything is written.

A sample of the corpus (`sample_texts`) is encoded by transformers itself (`tokenizer(texts)`):
those are the ids to match. `auto` tries the engines of `engines.ENGINES` fastest first and keeps
the first whose ids equal those on every sampled document; each engine passed over gets a reason
(not installed, cannot express the tokenizer, load error, or the first document and token where
its ids part from transformers'). An engine named in the config must be exact too, or nothing is
written (`choose_engine`). Giant documents are encoded in pieces only when the cut rule gives the
same ids on the sample (`check_pieces`, see `pieces`).

`EncoderSetup` is what a process needs to build the chosen encoder; `init_encoder` builds it in
this process (a worker, or the main process) into `state`, which `parts` encodes with.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moai.errors import TokenizerError
from moai.formats.text import ColumnRows, MappedTable, open_split_table, origins_of, text_bytes
from moai.stages.tokenize import engines, pieces
from moai.stages.tokenize.tiktoken import NotExpressible, TiktokenSpec, spec_from_tokenizer_json
from moai.stages.tokenizer import TokenizerInfo, loaded_tokenizer

log = logging.getLogger("moai.stages.tokenize")  # the stage's log lines keep the stage's name

# an engine must match transformers exactly on up to this many documents / bytes spread over the corpus
VERIFY_DOCUMENTS = 2000
VERIFY_BYTES = 2 << 20
VERIFY_DOCUMENT_BYTES = 64 << 10  # a sampled document is cut to this much text (giant documents)


Reference = Callable[[list[str]], list[list[int]]]


def transformers_reference(info: TokenizerInfo) -> Reference:
    """`tokenizer(texts)["input_ids"]` of the tokenizer as transformers loads it: the ids we must match."""
    tok = loaded_tokenizer(info.path, info.trust_remote_code)
    return lambda texts: tok(texts, verbose=False)["input_ids"] if texts else []


def first_difference(got: engines.Flat, want: engines.Flat, sample: list[str]) -> str | None:
    """None when `got` equals `want` (transformers' ids) on every document, else where they first part."""
    g_ids, g_off = got
    w_ids, w_off = want
    if np.array_equal(g_off, w_off) and np.array_equal(g_ids, w_ids):
        return None
    for i in range(len(sample)):
        a = g_ids[g_off[i] : g_off[i + 1]] if i + 1 < len(g_off) else g_ids[:0]
        b = w_ids[w_off[i] : w_off[i + 1]]
        if not np.array_equal(a, b):
            j = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            what = (
                f"id {int(a[j])} where transformers has {int(b[j])}"
                if j < min(len(a), len(b))
                else f"{len(a)} ids where transformers has {len(b)}"
            )
            return f"ids differ from transformers on sample document {i} ({sample[i][:60]!r}) at token {j}: {what}"
    return f"{len(g_off) - 1} documents came back for {len(sample)}"


Affixes = tuple[tuple[int, ...], tuple[int, ...]]
_affixes_known: dict[str, Affixes] = {}  # by pipeline: found once a process, or told (`known_affixes`)


def _affixes(info: TokenizerInfo) -> Affixes:
    """The ids the post-processor puts before and after a text (what gigatoken's native call leaves out)."""
    if info.backend_json not in _affixes_known:
        if len(_affixes_known) >= 4:
            _affixes_known.clear()
        _affixes_known[info.backend_json] = affixes_of(info.backend_json)
    return _affixes_known[info.backend_json]


def known_affixes(backend_json: str, affixes: Affixes) -> None:
    """`affixes_of(backend_json)`, found elsewhere (transformers' process): not found again here."""
    _affixes_known[backend_json] = affixes


def affixes_of(backend_json: str) -> Affixes:
    """Load the pipeline with `tokenizers` (0.3-0.4 s for 131k, holding the GIL) and find its affixes."""
    from moai.stages.tokenizer import rust_backend

    rust = rust_backend(backend_json)
    prefix, suffix = pieces.affixes(
        lambda texts, special: [e.ids for e in rust.encode_batch(texts, add_special_tokens=special)]
    )
    return tuple(prefix), tuple(suffix)


def engine_setup(name: str, info: TokenizerInfo, threads: int) -> EncoderSetup:
    """The set-up of engine `name` for this tokenizer (tiktoken: its spec, or `NotExpressible`)."""
    spec = spec_from_tokenizer_json(info.backend_json, info.split_special_tokens) if name == "tiktoken" else None
    affixes = _affixes(info) if name == "gigatoken" else ((), ())
    return EncoderSetup(info.backend_json, info.split_special_tokens, name, threads, False, spec, affixes, info.eos_id)


def try_engine(name: str, info: TokenizerInfo, sample: list[str], threads: int, want: engines.Flat, built: Any = None):
    """(set-up, encoder, None) when engine `name` gives `want` on the whole sample, else (None, None, why not).
    `built`: that engine's encoder, already built for this tokenizer (else it is built here)."""
    engine = engines.BY_NAME[name]
    try:
        setup = engine_setup(name, info, threads)
        encoder = built if built is not None else engines.build(setup)
    except ImportError as err:
        return None, None, f"not installed ({err}); {engine.install}"
    except NotExpressible as err:
        return None, None, f"cannot express this tokenizer: {err}"
    except Exception as err:  # the engine's own loader refused the tokenizer.json
        return None, None, f"load error: {_one_line(err)}"
    started = time.perf_counter()
    try:
        got = encoder.encode_flat(sample, True)
    except Exception as err:
        return None, None, f"failed on the sample: {_one_line(err)}"
    seconds = time.perf_counter() - started
    bad = first_difference(got, want, sample)
    if bad is not None:
        return None, None, bad
    mb = sum(len(t) for t in sample) / 1e6
    rate = f", {mb / seconds:,.0f} MB/s on it" if seconds > 0 else ""
    return setup, encoder, f"matches transformers on all {len(sample)} sampled documents{rate}"


def _one_line(err: Exception) -> str:
    """An engine's error as one line of the report: its type and first line (gigatoken's Rust errors
    go on with a blank line and the source location), at most 200 characters."""
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first[:200]}"


def choose_engine(
    requested: str,
    info: TokenizerInfo,
    sample: list[str],
    threads: int,
    want: list[list[int]] | engines.Flat,
    built: dict[str, engines.Encoder] | None = None,
) -> tuple[EncoderSetup, engines.Encoder, dict[str, str]]:
    """The first engine (in `engines.ENGINES` order, or the one named) whose ids equal `want`
    (transformers' ids of the sample) on every sampled document: its set-up, its encoder, and one
    line per engine tried (the chosen one last). An engine named in the config that is not exact
    is an error, and so is `auto` when not even `tokenizers` is: nothing is written."""
    names = [e.name for e in engines.ENGINES] if requested == "auto" else [requested]
    target = want if isinstance(want, tuple) else engines.flat_of(want)
    tried: dict[str, str] = {}
    for name in names:
        setup, encoder, why = try_engine(name, info, sample, threads, target, (built or {}).get(name))
        if setup is not None and encoder is not None:
            tried[name] = why
            log.info("tokenize engine %s: %s", name, why)
            return setup, encoder, tried
        tried[name] = why
        log.log(logging.WARNING if requested != "auto" or name == "tokenizers" else logging.INFO, "%s: %s", name, why)
    if requested != "auto":
        raise TokenizerError(
            f"tokenize.engine {requested}: {tried[requested]} (tokenizer {info.name_or_path!r}); nothing was "
            "written. Set tokenize.engine: auto to use the fastest engine that is exact on this corpus."
        )
    raise TokenizerError(
        f"tokenizer {info.name_or_path!r}: no engine gives transformers' ids on the sample ("
        + "; ".join(f"{k}: {v}" for k, v in tried.items())
        + "); nothing was written. Please report this tokenizer to moai."
    )


def check_pieces(encoder: engines.Encoder, sample: list[str], want: list[list[int]]) -> str | None:
    """None when giant documents can be encoded in pieces with exact ids (checked on the sample),
    else why they will be encoded whole."""
    bad = pieces.check_cut_rule(encoder.encode, sample, want)
    if bad is not None:
        log.warning(
            "documents over %d MiB will be encoded whole (memory grows with them): %s",
            pieces.LARGE_DOCUMENT_BYTES >> 20,
            bad,
        )
    return bad


def sample_rows(
    sizes: np.ndarray,
    origins: np.ndarray | None = None,
    n: int = VERIFY_DOCUMENTS,
    max_bytes: int = VERIFY_BYTES,
    doc_bytes: int = VERIFY_DOCUMENT_BYTES,
) -> np.ndarray:
    """Which of the documents of text sizes `sizes` the check samples, in row order: up to n (about
    max_bytes of text, each cut to doc_bytes). With `origins` (each row's source file and row), the
    n whose origins hash lowest: a spread over the corpus that depends on the rows themselves, not
    on their positions, so it hardly moves when a stage before drops a few rows (the reference
    process encodes a sample of the converted text while filter runs, `reference`). Without
    origins (all unknown), n rows spread evenly by position."""
    if len(sizes) == 0:
        return np.empty(0, dtype=np.int64)
    sizes = np.minimum(sizes, doc_bytes)
    mean = max(1.0, float(sizes.mean()))
    n = max(1, min(n, len(sizes), int(max_bytes / mean)))
    if origins is None or not (origins >= 0).any():
        return np.unique(np.linspace(0, len(sizes) - 1, num=n).astype(np.int64))
    if n >= len(sizes):
        return np.arange(len(sizes), dtype=np.int64)
    keys = _mix64(origins)
    return np.sort(np.argpartition(keys, n - 1)[:n]).astype(np.int64)


def _mix64(x: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random uint64 per value (splitmix64's finalizer), vectorized."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def sample_texts(
    text_dir: Path, n: int = VERIFY_DOCUMENTS, max_bytes: int = VERIFY_BYTES, doc_bytes: int = VERIFY_DOCUMENT_BYTES
) -> list[str]:
    """Up to n documents (about max_bytes of text, each cut to doc_bytes) over the train split."""
    mapped = MappedTable(text_dir, "train")
    rows = sample_rows(text_bytes(mapped.table), origins_of(mapped.table), n, max_bytes, doc_bytes)
    return read_sample(mapped, rows, doc_bytes)


def sample_texts_before_save(in_dir: Path, split: Any) -> list[str]:
    """`sample_texts` of the train split the save stage will write from `in_dir` with `split` (its
    `SplitConfig`), read from `in_dir` before save has written it: save copies the text and origin
    of every row as they are and picks the validation rows by `save.validation_rows`, a function of
    the row count."""
    from moai.stages.save import validation_rows

    mapped = MappedTable(in_dir)
    sizes, origins = text_bytes(mapped.table), origins_of(mapped.table)
    is_val = np.zeros(len(sizes), dtype=bool)
    is_val[validation_rows(len(sizes), split)] = True
    train = np.flatnonzero(~is_val)
    return read_sample(mapped, train[sample_rows(sizes[train], origins[train])], VERIFY_DOCUMENT_BYTES)


def candidate_texts(in_dir: Path, margin: float = 1.25) -> list[str]:
    """The documents of an earlier text stage's output (`in_dir`, e.g. convert's) that the check's
    sample will most likely hold, a quarter more of them: stages between may drop rows, and save
    takes the validation rows out. What the reference process encodes while filter runs."""
    mapped = MappedTable(in_dir)
    sizes, origins = text_bytes(mapped.table), origins_of(mapped.table)
    rows = sample_rows(sizes, origins, int(VERIFY_DOCUMENTS * margin), int(VERIFY_BYTES * margin))
    return read_sample(mapped, rows, VERIFY_DOCUMENT_BYTES)


def read_sample(mapped: MappedTable, rows: np.ndarray, doc_bytes: int) -> list[str]:
    """The text of `rows` of a mapped table, each cut to doc_bytes."""
    # Row by row from the mapped buffers: `take` on a chunked string column concatenates the
    # chunks first, and `as_py` would copy a whole giant document; this reads doc_bytes at most.
    # Each read faults in far more of the mapped file than the row (readahead): 1,336 rows spread
    # over 565 MB of text held ~450 MB resident. Dropping the pages every few rows keeps it small.
    row_bytes = ColumnRows(mapped.table.column(0))
    out = []
    for i, r in enumerate(rows):
        out.append(_utf8_prefix(row_bytes(int(r)), doc_bytes))
        if i % 32 == 31:
            mapped.release()
    mapped.release()
    return out


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
    engine: str  # a name in `engines.ENGINES`
    threads: int
    pieces_exact: bool  # may giant documents be encoded in pieces (checked on the sample; False when there are none)?
    spec: TiktokenSpec | None = None  # tiktoken's ranks (engine tiktoken)
    affixes: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # the post-processor's ids (engine gigatoken)
    eos_id: int | None = None  # what parts put after every document (fastokens: its post-processor does)


# Per-process state: the encoder, the piece encoder, opened tables and giant-document counts. Set
# by `init_encoder` in a worker, or in the main process; `parts` encodes and counts with it.
state: dict[str, Any] = {}


def init_encoder(
    setup: EncoderSetup,
    rayon_threads: int | None = None,
    warm_up: list[str] | None = None,
    spawned_at: float | None = None,
    encoder: engines.Encoder | None = None,
) -> None:
    """Set up this process's encoder (or take `encoder`, one already built for `setup`), then
    encode the warm-up texts once (thread pools, caches) so timing starts warm. `spawned_at`
    (`time.time()` when the parent started the pool): a worker records its start-up, which its
    first part's profile reports."""
    t0 = time.perf_counter()
    if rayon_threads is not None:
        # Read by Rayon when its pool first starts, which is after this in a fresh worker.
        os.environ["RAYON_NUM_THREADS"] = str(rayon_threads)
    engines.size_fastokens_pool(setup.threads)
    if encoder is None:
        encoder = engines.build(setup)
    state["encoder"] = encoder
    state["encode"] = encoder.encode  # lists: the piece encoder and whole giant documents
    state["pieces"] = pieces.PieceEncoder(encoder.encode) if setup.pieces_exact else None
    state["tables"] = {}
    state["forced_cuts"] = 0
    state["large_documents"] = 0
    if warm_up:
        encoder.encode_flat(warm_up, True)
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
    engines_tried: dict[str, str]  # engine -> why it was not used, or (the chosen one, last) that it is exact
    pieces_reason: str | None  # why giant documents are encoded whole, or None (in exact pieces)
    sample: list[str]
    encoder: engines.Encoder | None = field(default=None, repr=False, compare=False)  # built for `setup`
    seconds: dict[str, float] = field(default_factory=dict, compare=False)  # the check's parts (`choose_encoder`)

    @property
    def engine(self) -> str:
        return self.setup.engine

    @property
    def engine_reason(self) -> str:
        return f"{self.engine} {self.engines_tried[self.engine]}"


def has_large_documents(text_dir: Path, sizes: dict[str, np.ndarray] | None = None) -> bool:
    """Does any split hold a document over `pieces.LARGE_DOCUMENT_BYTES` (encoded in pieces)?
    `sizes`: each split's text bytes a row (`parts.split_sizes`), when the caller has them."""
    for split in ("train", "validation"):
        lengths = sizes[split] if sizes is not None else text_bytes(open_split_table(text_dir, split))
        if len(lengths) and int(lengths.max()) > pieces.LARGE_DOCUMENT_BYTES:
            return True
    return False


def choose_encoder(
    info: TokenizerInfo,
    text_dir: Path,
    requested: str,
    threads: int,
    reference: Reference | None = None,
    prefetched: tuple[list[str], engines.Flat] | None = None,
    built: dict[str, engines.Encoder] | None = None,
    large: bool | None = None,
) -> EngineChoice:
    """Sample the corpus, choose the engine, check it against transformers, and the piece rule too
    when the corpus has a document large enough to be encoded in pieces (else the rule is never
    used, and checking it would cost ~0.3-0.6 s of every run for nothing). `reference` gives
    transformers' ids (default: `transformers_reference` in this process); `prefetched`, the same
    sample of `text_dir` and transformers' ids of it, made while save wrote it (`reference`);
    `large`: `has_large_documents(text_dir)`, when the caller has it."""
    t0 = time.perf_counter()
    if prefetched is not None:
        sample, want_flat = prefetched
        t1 = t0
    else:
        sample = sample_texts(text_dir)
        t1 = time.perf_counter()
        want_flat = engines.flat_of((reference or transformers_reference(info))(sample))
    t2 = time.perf_counter()
    setup, encoder, tried = choose_engine(requested, info, sample, threads, want_flat, built)
    t3 = time.perf_counter()
    if large is None:
        large = has_large_documents(text_dir)
    pieces_reason = check_pieces(encoder, sample, engines.lists_of(want_flat)) if large else None
    setup = dataclasses.replace(setup, pieces_exact=large and pieces_reason is None)
    seconds = {"sample": t1 - t0, "transformers": t2 - t1, "engines": t3 - t2, "pieces": time.perf_counter() - t3}
    return EngineChoice(setup, tried, pieces_reason, sample, encoder, {k: round(v, 3) for k, v in seconds.items()})
