"""tokenize: saved text → flat token store (see `moai.formats.tokens` for the layout).

How it stays at the tokenizer's own speed:

- Each split is cut into fixed row ranges ("parts"). A worker memory-maps the saved Arrow
  shards itself and reads its rows: no text is pickled through a pipe.
- Each part is encoded in batches with `encode_batch_fast` (no offsets), converted to uint16 /
  uint32 per document by NumPy, and written by the worker to its own `.bin`/`.idx`: there is no
  single writer that every token funnels through.
- Workers start with `spawn` and build their own tokenizer from the exact backend pipeline the
  main process loaded; the number of processes and Rayon threads each comes from the hardware
  plan. With one process (small machines) the work runs in this process, no start-up cost.

Memory is bounded by one batch per worker (plus the document offsets being written), whatever
the corpus size; a document larger than a batch is read from the mapped file and encoded in
pieces at places where that gives the same ids (`moai.encoding`), so one giant document does not
take the machine down either. Every document gets EOS appended after the tokenizer's own special
tokens, so a document's ids equal `tokenizer(text)["input_ids"] + [eos]`: before anything is
written, the chosen engine is checked against transformers itself on a sample of the corpus.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

import numpy as np

from moai import encoding
from moai.errors import TokenizerError
from moai.stages.tokenizer import TokenizerInfo, load_tokenizer
from moai.tiktoken_bpe import NotExpressible, TiktokenSpec, spec_from_tokenizer_json
from moai.formats.text import MappedTable, open_split_table
from moai.formats.tokens import STORE_FORMAT

log = logging.getLogger(__name__)

# 2: the backend runs as transformers runs it (no truncation/padding from tokenizer.json,
# split_special_tokens applied); giant documents in exact pieces; checked against transformers.
VERSION = 2
SPLITS = ("train", "validation")
MAX_PARTS = 64  # parts per split: enough to keep 64 workers busy
PART_MIN_BYTES = 1 << 20  # few files for small data
# tiktoken must match tokenizers exactly on up to this many documents / bytes spread over the corpus
VERIFY_DOCUMENTS = 2000
VERIFY_BYTES = 2 << 20
VERIFY_DOCUMENT_BYTES = 64 << 10  # a sampled document is cut to this much text (giant documents)
BATCH_MAX_BYTES = 4 << 20  # text per encode call, whatever the document count
WARM_UP_DOCUMENTS = 64


Reference = Callable[[list[str]], list[list[int]]]


def transformers_reference(info: TokenizerInfo) -> Reference:
    """`tokenizer(texts)["input_ids"]` of the tokenizer as transformers loads it: the ids we must match."""
    tok = load_tokenizer(info.path)
    return lambda texts: tok(texts, verbose=False)["input_ids"] if texts else []


def _first_mismatch(encode: encoding.Encode, want: list[list[int]], sample: list[str]) -> int | None:
    for i, (a, b) in enumerate(zip(encode(sample, True), want)):
        if list(a) != list(b):
            return i
    return None


def choose_engine(requested: str, info: TokenizerInfo, sample: list[str], threads: int,
                  want: list[list[int]]) -> tuple[TiktokenSpec | None, str]:
    """(tiktoken spec or None for tokenizers, reason). An engine is used only when its ids equal
    `want` (transformers' ids of the sample) on every sampled document; when not even `tokenizers`
    does, nothing is written."""
    spec, reason = None, "tokenize.engine is tokenizers"
    if requested != "tokenizers":
        try:
            spec = spec_from_tokenizer_json(info.backend_json, info.split_special_tokens)
        except NotExpressible as err:
            reason = f"tiktoken cannot express this tokenizer ({err}); using tokenizers"
            log.log(logging.WARNING if requested == "tiktoken" else logging.INFO, reason)
    if spec is not None:
        bad = _first_mismatch(encoding.make_encoder(info.backend_json, info.split_special_tokens, spec, threads),
                              want, sample)
        if bad is None:
            reason = f"tiktoken matches transformers on all {len(sample)} sampled documents"
            log.info(reason)
            return spec, reason
        reason = f"tiktoken ids differ from transformers on sample document {bad} ({sample[bad][:60]!r}); using tokenizers"
        log.warning(reason)
    bad = _first_mismatch(encoding.make_encoder(info.backend_json, info.split_special_tokens), want, sample)
    if bad is not None:
        raise TokenizerError(
            f"tokenizer {info.name_or_path!r}: moai's encoder gives other ids than transformers on sample document "
            f"{bad} ({sample[bad][:60]!r}); nothing was written. Please report this tokenizer to moai."
        )
    return None, reason


def check_pieces(spec: TiktokenSpec | None, info: TokenizerInfo, sample: list[str], threads: int,
                 want: list[list[int]]) -> str | None:
    """None when giant documents can be encoded in pieces with exact ids (checked on the sample),
    else why they will be encoded whole."""
    encode = encoding.make_encoder(info.backend_json, info.split_special_tokens, spec, threads)
    bad = encoding.check_cut_rule(encode, sample, want)
    if bad is not None:
        log.warning("documents over %d MiB will be encoded whole (memory grows with them): %s",
                    encoding.LARGE_DOCUMENT_BYTES >> 20, bad)
    return bad


def sample_texts(text_dir: Path, n: int = VERIFY_DOCUMENTS, max_bytes: int = VERIFY_BYTES,
                 doc_bytes: int = VERIFY_DOCUMENT_BYTES) -> list[str]:
    """Up to n documents (about max_bytes of text, each cut to doc_bytes) spread over the train split."""
    table = open_split_table(text_dir, "train")
    if table.num_rows == 0:
        return []
    sizes = np.minimum(_text_bytes(table), doc_bytes)
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


def row_bytes(column, row: int) -> memoryview:
    """The UTF-8 bytes of one value of a (chunked) string column, without copying them."""
    import pyarrow as pa

    for chunk in column.chunks:
        if row < len(chunk):
            break
        row -= len(chunk)
    if chunk.null_count and not chunk[row].is_valid:
        return memoryview(b"")
    offsets_type = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
    _, offsets_buf, data_buf = chunk.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offsets_type)
    start, stop = int(offsets[chunk.offset + row]), int(offsets[chunk.offset + row + 1])
    return memoryview(data_buf)[start:stop]


def part_ranges(text_bytes: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges of a split's parts, cut at equal shares of text bytes.

    A function of the data alone (not of the worker count), so the files come out the same for any
    number of workers. Parts hold at least PART_MIN_BYTES of text, and there are at most MAX_PARTS.
    """
    rows = len(text_bytes)
    if rows == 0:
        return []
    cum = np.cumsum(text_bytes, dtype=np.int64)
    total = int(cum[-1])
    parts = int(min(MAX_PARTS, rows, max(1, total // PART_MIN_BYTES)))
    # cut after the row holding each 1/parts share of the bytes
    cuts = np.minimum(np.searchsorted(cum, (np.arange(1, parts) * total) // parts, side="left") + 1, rows)
    bounds = np.unique(np.concatenate([[0], cuts, [rows]]))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _text_bytes(table) -> np.ndarray:
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    return pc.binary_length(table.column(0)).fill_null(0).to_numpy().astype(np.int64)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


@dataclass(frozen=True)
class PartJob:
    text_dir: str
    split: str
    index: int
    start: int
    stop: int
    out_dir: str
    dtype: str
    eos_id: int
    batch_size: int


# Per-process state: the encoder and opened tables. Set by `_init` in a worker, or in the main process.
_state: dict[str, Any] = {}


@dataclass(frozen=True)
class EncoderSetup:
    """What a process needs to build its encoder; small and picklable."""

    backend_json: str
    split_special_tokens: bool
    spec: TiktokenSpec | None
    threads: int
    pieces_exact: bool  # may giant documents be encoded in pieces (checked on the sample)?


def init_encoder(setup: EncoderSetup, rayon_threads: int | None = None, warm_up: list[str] | None = None) -> None:
    """Set up this process's encoder, then encode the warm-up texts once (thread pools, caches) so
    timing starts warm."""
    if rayon_threads is not None:
        # Read by Rayon when its pool first starts, which is after this in a fresh worker.
        os.environ["RAYON_NUM_THREADS"] = str(rayon_threads)
    encode = encoding.make_encoder(setup.backend_json, setup.split_special_tokens, setup.spec, setup.threads)
    _state["encode"] = encode
    _state["pieces"] = encoding.PieceEncoder(encode) if setup.pieces_exact else None
    _state["tables"] = {}
    _state["forced_cuts"] = 0
    _state["large_documents"] = 0
    if warm_up:
        encode(warm_up, True)


def clear_encoder() -> None:
    """Drop this process's encoder and table maps."""
    _state.clear()


def encode_documents(texts: list[str], eos_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Encode texts with the process's encoder: (flat ids with EOS after each, document lengths)."""
    ids = _state["encode"](texts, True)
    lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
    ends = np.cumsum(lengths)
    flat = np.empty(int(ends[-1]) if len(ends) else 0, dtype=dtype)
    start = 0
    for x, end in zip(ids, ends):
        flat[start : end - 1] = x
        start = end
    flat[ends - 1] = eos_id
    return flat, lengths


def encode_parts(jobs: list[PartJob], on_batch=None) -> list[dict[str, int]]:
    """Encode and write parts in order, as one pipelined stream of batches (no bubble between parts)."""
    tables = _state["tables"]

    def batches():
        """Lists of (job, texts) pieces across part edges, of at most batch_size documents and
        about BATCH_MAX_BYTES of text together: memory per batch is bounded for any document size.
        A document over LARGE_DOCUMENT_BYTES is a group of its own: (job, its mapped bytes)."""
        group, docs, size = [], 0, 0
        for job in jobs:
            key = (job.text_dir, job.split)
            if key not in tables:
                tables[key] = MappedTable(job.text_dir, job.split)
            table = tables[key].table
            sizes = _text_bytes(table.slice(job.start, job.stop - job.start))
            cum = np.cumsum(sizes)
            large = list(np.flatnonzero(sizes > encoding.LARGE_DOCUMENT_BYTES)) + [len(sizes)]
            lo = 0
            while lo < len(cum):
                if lo == large[0]:
                    if group:
                        yield group
                        group, docs, size = [], 0, 0
                    yield [(job, row_bytes(table.column(0), job.start + lo))]
                    large.pop(0)
                    lo += 1
                    continue
                before = int(cum[lo - 1]) if lo else 0
                by_bytes = int(np.searchsorted(cum, before + BATCH_MAX_BYTES - size, side="left")) + 1
                hi = min(len(cum), lo + job.batch_size - docs, max(by_bytes, lo + 1), large[0])
                texts = table.slice(job.start + lo, hi - lo).column(0).fill_null("").to_pylist()
                group.append((job, texts))
                docs, size = docs + (hi - lo), size + int(cum[hi - 1]) - before
                lo = hi
                if docs >= job.batch_size or size >= BATCH_MAX_BYTES:
                    yield group
                    group, docs, size = [], 0, 0
        if group:
            yield group

    def encode(group):
        """Encode a group in one call, then cut the ids back into its pieces."""
        if isinstance(group[0][1], memoryview):
            job, data = group[0]
            return [(job, encode_large(data, job.eos_id, np.dtype(job.dtype)))]
        texts = [t for _, piece in group for t in piece]
        flat, lengths = encode_documents(texts, group[0][0].eos_id, np.dtype(group[0][0].dtype))
        out, doc, tok = [], 0, 0
        for job, piece in group:
            n = len(piece)
            ntok = int(lengths[doc : doc + n].sum())
            out.append((job, (flat[tok : tok + ntok], lengths[doc : doc + n])))
            doc, tok = doc + n, tok + ntok
        return out

    results: list[dict[str, int]] = []
    current = None
    files = None
    try:
        for job, (flat, lengths) in (piece for group in _pipelined(batches(), encode) for piece in group):
            if job is not current:
                if files:
                    files[0].close(), files[1].close()
                current = job
                stem = Path(job.out_dir) / job.split / f"part-{job.index:05d}"
                files = (open(f"{stem}.bin", "wb"), open(f"{stem}.idx", "wb"))
                results.append({"index": job.index, "split": job.split, "num_documents": 0, "num_tokens": 0,
                                "bin": f"{job.split}/{stem.name}.bin", "idx": f"{job.split}/{stem.name}.idx"})
            r = results[-1]
            files[0].write(flat.tobytes())
            files[1].write((np.cumsum(lengths) + r["num_tokens"]).astype("<i8").tobytes())
            r["num_tokens"] += len(flat)
            r["num_documents"] += len(lengths)
            if on_batch is not None:
                on_batch(len(lengths), len(flat))
            for t in tables.values():
                t.release()  # text already read: keep resident memory flat over the corpus
    finally:
        if files:
            files[0].close(), files[1].close()
    for r in results:  # giant documents are counted per process; the first result carries the count
        r["large_documents"], r["forced_cuts"] = _state["large_documents"], _state["forced_cuts"]
        _state["large_documents"] = _state["forced_cuts"] = 0
    return results


def encode_large(data: memoryview, eos_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """One giant document, in exact pieces where the tokenizer allows it (else whole)."""
    _state["large_documents"] += 1
    pieces = _state["pieces"]
    if pieces is None:
        ids = np.asarray(_state["encode"]([bytes(data).decode("utf-8")], True)[0], dtype=np.uint32)
    else:
        ids, forced = pieces.encode_document(data)
        if forced:
            log.warning("a %d MB document has %d stretch(es) of %d MiB without a newline or space; cut there "
                        "(ids next to such a cut may differ from transformers)", len(data) >> 20, forced,
                        encoding.MAX_SEARCH_PIECES * encoding.PIECE_BYTES >> 20)
        _state["forced_cuts"] += forced
    flat = np.empty(len(ids) + 1, dtype=dtype)
    flat[:-1] = ids
    flat[-1] = eos_id
    return flat, np.array([len(flat)], dtype=np.int64)


def _encode_part(job: PartJob) -> dict[str, int]:
    """One part, in a worker process."""
    return encode_parts([job])[0]


def _pipelined(items, fn, ahead: int = 2):
    """Yield fn(item) for each item in order, with `ahead` calls running in helper threads.

    The encoders release the GIL, so two batches in flight keep every core busy through the tail
    of each batch (the longest documents) while this thread converts and writes.
    """
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(ahead) as ex:
        pending: deque = deque()
        for item in items:
            pending.append(ex.submit(fn, item))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def plan_parts(info: TokenizerInfo, text_dir: Path, out_dir: Path, batch_size: int) -> list[PartJob]:
    """Every part of every split, in order, writing under out_dir/<split>/."""
    dtype = token_dtype(info.vocab_size)
    jobs: list[PartJob] = []
    for split in SPLITS:
        sizes = _text_bytes(open_split_table(text_dir, split))
        for i, (lo, hi) in enumerate(part_ranges(sizes)):
            jobs.append(PartJob(str(text_dir), split, i, lo, hi, str(out_dir), dtype.str, info.eos_id, batch_size))
    return jobs


def write_store_meta(info: TokenizerInfo, out_dir: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Write tokens.json for the parts in `results`; return its per-split summary."""
    splits: dict[str, Any] = {}
    for split in SPLITS:
        parts = sorted((r for r in results if r["split"] == split), key=lambda r: r["index"])
        splits[split] = {
            "num_tokens": sum(p["num_tokens"] for p in parts),
            "num_documents": sum(p["num_documents"] for p in parts),
            "parts": [{k: p[k] for k in ("bin", "idx", "num_tokens", "num_documents")} for p in parts],
        }
    meta = {
        "format": STORE_FORMAT,
        "dtype": token_dtype(info.vocab_size).str,
        "eos_id": info.eos_id,
        "vocab_size": info.vocab_size,
        "tokenizer": info.name_or_path,
        "tokenizer_fingerprint": info.fingerprint,
        "splits": splits,
    }
    (out_dir / "tokens.json").write_text(json.dumps(meta, indent=2))
    return splits


def _peak_rss_mb() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return round(own, 1), round(children, 1)


@dataclass(frozen=True)
class EngineChoice:
    """The checked encoder set-up for a corpus, why, and the sample it was checked on."""

    setup: EncoderSetup
    engine_reason: str
    pieces_reason: str | None  # why giant documents are encoded whole, or None (in exact pieces)
    sample: list[str]

    @property
    def engine(self) -> str:
        return "tiktoken" if self.setup.spec is not None else "tokenizers"


def choose_encoder(info: TokenizerInfo, text_dir: Path, requested: str, threads: int) -> EngineChoice:
    """Sample the corpus, choose the engine, check it and the piece rule against transformers."""
    sample = sample_texts(text_dir)
    want = transformers_reference(info)(sample)
    spec, reason = choose_engine(requested, info, sample, threads, want)
    pieces_reason = check_pieces(spec, info, sample, threads, want)
    setup = EncoderSetup(info.backend_json, info.split_special_tokens, spec, threads, pieces_reason is None)
    return EngineChoice(setup, reason, pieces_reason, sample)


def tokenize(
    info: TokenizerInfo,
    text_dir: Path,
    out_dir: Path,
    *,
    num_proc: int,
    threads_per_proc: int,
    batch_size: int,
    engine: str = "auto",
    progress: bool = True,
    on_progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Tokenize every split of a saved DatasetDict folder into a token store in `out_dir`."""
    from tqdm.auto import tqdm

    log.info("tokenizer %s is fast (Rust tokenizers backend), vocab %d, EOS id %d",
             info.name_or_path, info.vocab_size, info.eos_id)
    choice = choose_encoder(info, text_dir, engine, threads_per_proc)
    dtype = token_dtype(info.vocab_size)
    jobs = plan_parts(info, text_dir, out_dir, batch_size)
    for split in SPLITS:
        (out_dir / split).mkdir(parents=True, exist_ok=True)
    total_docs = sum(j.stop - j.start for j in jobs)
    num_proc = max(1, min(num_proc, len(jobs)))
    warm_up = choice.sample[:WARM_UP_DOCUMENTS]
    if num_proc == 1:  # workers warm up in their initializer, before their first part
        init_encoder(choice.setup, None, warm_up)
    started = time.perf_counter()

    bar = tqdm(total=total_docs, unit="doc", desc="tokenize", disable=not progress, mininterval=0.5)
    done_tokens = done_docs = 0
    reported = 0.0

    def advance(docs: int, tokens: int) -> None:
        nonlocal done_tokens, done_docs, reported
        done_tokens += tokens
        done_docs += docs
        bar.update(docs)
        elapsed = max(time.perf_counter() - started, 1e-9)
        bar.set_postfix_str(f"{done_tokens / elapsed:,.0f} tok/s", refresh=False)
        fraction = done_docs / max(total_docs, 1)
        if on_progress is not None and (fraction - reported >= 0.02 or fraction >= 1.0):
            reported = fraction
            on_progress(fraction)

    results: list[dict[str, int]] = []
    try:
        if num_proc == 1:
            results = encode_parts(jobs, on_batch=advance)
        else:
            ctx = get_context("spawn")
            with ProcessPoolExecutor(num_proc, mp_context=ctx, initializer=init_encoder,
                                     initargs=(choice.setup, threads_per_proc, warm_up)) as pool:
                futures = {pool.submit(_encode_part, job): job for job in jobs}
                for fut in as_completed(futures):
                    r = fut.result()
                    results.append(r)
                    advance(r["num_documents"], r["num_tokens"])
    finally:
        bar.close()
        clear_encoder()  # drop this process's tokenizer and table maps (inline mode)

    seconds = time.perf_counter() - started
    splits = write_store_meta(info, out_dir, results)
    num_tokens = sum(s["num_tokens"] for s in splits.values())
    own_mb, workers_mb = _peak_rss_mb()
    return {
        "rows_in": total_docs,
        "rows_out": total_docs,
        "documents": total_docs,
        "tokens": num_tokens,
        "splits": {k: {"documents": v["num_documents"], "tokens": v["num_tokens"]} for k, v in splits.items()},
        "seconds": round(seconds, 3),
        "tokens_per_s": round(num_tokens / seconds, 1) if seconds > 0 else None,
        "engine": choice.engine,
        "engine_reason": choice.engine_reason,
        "large_documents": sum(r.get("large_documents", 0) for r in results),
        "forced_cuts": sum(r.get("forced_cuts", 0) for r in results),
        "large_documents_whole": choice.pieces_reason,
        "processes": num_proc,
        "threads_per_process": threads_per_proc,
        "dtype": dtype.name,
        "peak_rss_mb": own_mb,
        "peak_worker_rss_mb": workers_mb if num_proc > 1 else None,
        "warnings": info.warnings,
    }
