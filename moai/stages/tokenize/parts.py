"""The tokenize stage's parts: fixed row ranges of the saved text, each encoded into its own files.

- Each split is cut into fixed row ranges ("parts") by text bytes alone, so the files come out
  the same for any number of workers (`part_ranges`, `plan_parts`).
- A process memory-maps the saved Arrow shards itself and reads its rows: no text is pickled
  through a pipe (an engine that reads Arrow text, gigatoken, gets the mapped buffers themselves;
  the others `str`s). Parts are encoded in batches of bounded text (`encode_parts`), converted to
  uint16 / uint32 per document by NumPy, and written by that process to the part's own
  `.bin`/`.idx`: there is no single writer that every token funnels through. The `.bin` goes past
  the page cache while the disk keeps up (`idsfile`).
- A document over `pieces.LARGE_DOCUMENT_BYTES` is read from the mapped file and encoded on its own, in exact
  pieces where the tokenizer allows it (`encode_large`, see `pieces`).

Every document gets EOS appended after the tokenizer's own special tokens. The encoder is the
one `engine.init_encoder` set up in this process. `write_store_meta` writes `tokens.json` for
the parts (see `moai.formats.tokens` for the layout).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moai.formats.text import (
    ColumnRows,
    MappedTable,
    copy_origin_files,
    filled,
    open_split_table,
    origins_of,
    text_bytes,
    text_list,
)
from moai.formats.tokens import STORE_FORMAT
from moai.stages.tokenize import engines, idsfile, pieces
from moai.stages.tokenize.engine import state
from moai.stages.tokenizer import TokenizerInfo
from moai.store import remember_digests

log = logging.getLogger("moai.stages.tokenize")  # the stage's log lines keep the stage's name

SPLITS = ("train", "validation")
MAX_PARTS = 64  # parts per split: enough to keep 64 workers busy
PART_MIN_BYTES = 1 << 20  # few files for small data
BATCH_MAX_BYTES = 4 << 20  # text per encode call, whatever the document count


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
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def documents_a_call(engine: str, batch_size: int, fast_batch_size: int | None) -> int:
    """Documents a call at most with `engine`: fastokens and gigatoken take `fast_batch_size` (the
    plan's, sized by the text) where given, the other engines `batch_size`."""
    return fast_batch_size or batch_size if engine in engines.FAST else batch_size


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


# Batches read and queued for the encode threads (engines.CALLS_IN_FLIGHT of them). Results come
# back in order: with only as many queued as threads, a thread that finished the batches after a
# long one sat idle until that one was done (a fifth of the wall time on 2 cores, 601 MB corpus).
BATCHES_AHEAD = 6
# Ids encoded and waiting for the writer thread, at most (bytes): a disk that stalls fills the queue.
# Counted in pieces (12), it held ~19 MB of ids with calls of 1,000 documents and up to ~48 MB with
# calls of ~4 MB of text (docs/performance.md, "Calls sized by the text").
WRITES_AHEAD_BYTES = 16 << 20
# Rows taken out of Arrow into Python strings at a time. That holds the GIL throughout, and an
# encode thread coming back from fastokens waits for it: ~0.6 ms at a time instead of ~1.5 ms.
READ_ROWS = 1024
# Text given to one set of encode threads before new ones take over (`_pipelined`), where the
# engine keeps a cache in each thread that calls it (`caches_per_thread`: fastokens with a pool of
# one, on 2 cores). Nothing empties fastokens' word cache but the thread's end: with the same two
# threads throughout, the parts' memory grew with the corpus (`benchmarks/stage_parts.py`, 551 MB
# of text: +170-186 MB, its first quarter +104-112); renewed every 128 MiB, +119-120 against
# +107-112, the wall time within the rounds' spread (docs/performance.md, "Peak memory over the
# corpus").
RENEW_THREADS_BYTES = 128 << 20


class Profile:
    """Seconds this process spent, by kind, while encoding parts (`encode_parts`): reading text
    (`read`, the main thread), the encoder itself (`encode`) and ids → arrays (`arrays`), both in
    the helper threads, writing (`write`) and waiting for the helpers (`wait`, main thread).
    Helper-thread seconds overlap, so their share of wall time can pass 100%. The same by CPU
    seconds of the threads that did them (`*_cpu`; `encode_cpu` covers the arrays too): on cores
    that are all busy, wall seconds count the time a thread waited for a core. `write_wait`: the
    main thread waiting for the writer, its queue full."""

    KINDS = ("read", "encode", "arrays", "write", "wait", "read_cpu", "encode_cpu", "write_cpu", "write_wait")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.KINDS, 0.0)
        self._lock = threading.Lock()

    def add(self, kind: str, seconds: float) -> None:
        with self._lock:
            self.seconds[kind] += seconds

    def take(self) -> dict[str, float]:
        """The seconds so far (rounded), and start again from zero."""
        with self._lock:
            out = {k: round(v, 4) for k, v in self.seconds.items()}
            self.seconds = dict.fromkeys(self.KINDS, 0.0)
        return out


def _profile() -> Profile:
    return state.setdefault("profile", Profile())


def encode_documents(texts: list[str], eos_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Encode texts with the process's encoder: (flat ids with EOS after each, document lengths).
    The engine hands all ids over as one array, EOS put in by its post-processor (fastokens) or by
    NumPy: no loop over documents."""
    t0, cpu = time.perf_counter(), time.thread_time()
    ids, offsets = state["encoder"].encode_documents(texts, eos_id)
    t1 = time.perf_counter()
    out = ids.astype(dtype, copy=False)
    profile = _profile()
    profile.add("encode", t1 - t0)
    profile.add("arrays", time.perf_counter() - t1)
    profile.add("encode_cpu", time.thread_time() - cpu)
    return out, np.diff(offsets)


def encode_parts(jobs: list[PartJob], on_batch=None) -> list[dict[str, Any]]:
    """Encode and write parts in order, as one pipelined stream of batches (no bubble between parts).

    The first result carries this process's `profile` (`Profile`, plus `wall` and `pid`)."""
    tables = state["tables"]
    arrow = getattr(state["encoder"], "takes_arrow", False)
    profile = _profile()
    profile.take()  # what warm-up and checks spent is not part of it
    started, cpu_started, main_started = time.perf_counter(), time.process_time(), time.thread_time()

    def batches():
        """Lists of (job, texts) pieces across part edges, of at most batch_size documents and
        about BATCH_MAX_BYTES of text together: memory per batch is bounded for any document size.
        A document over LARGE_DOCUMENT_BYTES is a group of its own: (job, its mapped bytes). Each
        comes with its bytes of text."""
        group: list[tuple[PartJob, Any]]
        group, docs, size = [], 0, 0
        large_rows: dict[tuple[str, str], ColumnRows] = {}  # a split's, made at its first large document
        for job in jobs:
            key = (job.text_dir, job.split)
            if key not in tables:
                tables[key] = MappedTable(job.text_dir, job.split)
            table = tables[key].table
            sizes = text_bytes(table.slice(job.start, job.stop - job.start))
            cum = np.cumsum(sizes)
            large = [*np.flatnonzero(sizes > pieces.LARGE_DOCUMENT_BYTES), len(sizes)]
            lo = 0
            while lo < len(cum):
                if lo == large[0]:
                    if group:
                        yield group, size
                        group, docs, size = [], 0, 0
                    if key not in large_rows:
                        large_rows[key] = ColumnRows(table.column(0))
                    data = large_rows[key](job.start + lo)
                    yield [(job, data)], len(data)
                    large.pop(0)
                    lo += 1
                    continue
                before = int(cum[lo - 1]) if lo else 0
                by_bytes = int(np.searchsorted(cum, before + BATCH_MAX_BYTES - size, side="left")) + 1
                hi = min(len(cum), lo + job.batch_size - docs, max(by_bytes, lo + 1), large[0])
                texts: Any
                if arrow:  # the encoder reads the mapped text in place: no Python `str` (gigatoken)
                    texts = filled(table.column(0).slice(job.start + lo, hi - lo)).combine_chunks()
                else:
                    texts = []
                    for at in range(job.start + lo, job.start + hi, READ_ROWS):
                        texts += text_list(table.slice(at, min(READ_ROWS, job.start + hi - at)).column(0))
                group.append((job, texts))
                docs, size = docs + (hi - lo), size + int(cum[hi - 1]) - before
                lo = hi
                if docs >= job.batch_size or size >= BATCH_MAX_BYTES:
                    yield group, size
                    group, docs, size = [], 0, 0
        if group:
            yield group, size

    def encode(batch):
        """Encode a group in one call, then cut the ids back into its pieces."""
        group, _ = batch
        if isinstance(group[0][1], memoryview):
            job, data = group[0]
            return [(job, encode_large(data, job.eos_id, np.dtype(job.dtype)))]
        if arrow:
            import pyarrow as pa

            arrays = [piece for _, piece in group]
            if len({p.type for p in arrays}) > 1:  # splits saved with different string types
                arrays = [p.cast(pa.large_string()) for p in arrays]
            texts = arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)
        else:
            texts = [t for _, piece in group for t in piece]
        flat, lengths = encode_documents(texts, group[0][0].eos_id, np.dtype(group[0][0].dtype))
        out, doc, tok = [], 0, 0
        for job, piece in group:
            n = len(piece)
            ntok = int(lengths[doc : doc + n].sum())
            out.append((job, (flat[tok : tok + ntok], lengths[doc : doc + n])))
            doc, tok = doc + n, tok + ntok
        return out

    results: list[dict[str, Any]] = []
    current: list[Any] = [None, None]  # the part being written and its (.bin, .idx) files
    buffer = idsfile.take_buffer()  # the writer's, reused part after part
    pace = idsfile.Pace()  # the ids go past the page cache while the disk keeps up (`idsfile`)

    def write(job: PartJob, flat: np.ndarray, lengths: np.ndarray) -> None:
        """In the writer thread, in order: a piece's ids and document ends into its part's files."""
        t0, cpu = time.perf_counter(), time.thread_time()
        if job is not current[0] or current[1] is None:
            _close(current, results)
            current[0] = job
            stem = Path(job.out_dir) / job.split / f"part-{job.index:05d}"
            # open across the part's batches: closed when the next part starts, or at the end
            ids = idsfile.IdsFile(Path(f"{stem}.bin"), buffer if pace.direct else None, pace)
            current[1] = (ids, open(f"{stem}.idx", "wb"))  # noqa: SIM115
            results.append(
                {
                    "index": job.index,
                    "split": job.split,
                    "num_documents": 0,
                    "num_tokens": 0,
                    "bin": f"{job.split}/{stem.name}.bin",
                    "idx": f"{job.split}/{stem.name}.idx",
                }
            )
        r, files = results[-1], current[1]
        if not pace.keeps_up(flat.nbytes) and files[0].direct:
            log.info("the disk is behind the encoder: the rest of the ids go through the page cache")
            files[0].to_page_cache()
        files[0].write(flat.data)  # no copy of the ids
        files[1].write((np.cumsum(lengths) + r["num_tokens"]).astype("<i8").tobytes())
        r["num_tokens"] += len(flat)
        r["num_documents"] += len(lengths)
        profile.add("write", time.perf_counter() - t0)
        profile.add("write_cpu", time.thread_time() - cpu)

    failed = threading.Event()

    def write_unless_failed(job: PartJob, flat: np.ndarray, lengths: np.ndarray) -> None:
        """`write`, unless one before failed: its error is the one raised, once (a full disk: the
        writes queued after it are not tried, and the part is not closed twice)."""
        if failed.is_set():
            return
        try:
            write(job, flat, lengths)
        except BaseException:
            failed.set()
            raise

    # Writing runs in a thread of its own (file writes release the GIL): this thread goes on taking
    # the next texts out of Arrow meanwhile. At most WRITES_AHEAD_BYTES of ids wait for it (bounded
    # memory), and one piece however large.
    from concurrent.futures import ThreadPoolExecutor

    writes: collections.deque = collections.deque()
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="moai-write") as writer:
            try:
                pipeline = _pipelined(
                    _timed(batches(), profile),
                    encode,
                    engines.CALLS_IN_FLIGHT,
                    BATCHES_AHEAD,
                    profile=profile,
                    weigh=lambda batch: batch[1],
                    renew_after=RENEW_THREADS_BYTES if getattr(state["encoder"], "caches_per_thread", False) else 0,
                )
                queued = 0  # bytes of ids in `writes`
                for job, (flat, lengths) in (piece for group in pipeline for piece in group):
                    writes.append((writer.submit(write_unless_failed, job, flat, lengths), flat.nbytes))
                    queued += flat.nbytes
                    while queued > WRITES_AHEAD_BYTES and len(writes) > 1:
                        t0 = time.perf_counter()
                        done, nbytes = writes.popleft()
                        done.result()
                        queued -= nbytes
                        profile.add("write_wait", time.perf_counter() - t0)
                    if on_batch is not None:
                        on_batch(len(lengths), len(flat))
                    for t in tables.values():
                        t.release()  # text already read: keep resident memory flat over the corpus
                while writes:
                    writes.popleft()[0].result()
            except BaseException:
                failed.set()  # the writes still queued do nothing
                raise
    finally:
        try:
            if failed.is_set():
                _abandon(current)
            else:
                _close(current, results)
        finally:
            idsfile.give_back(buffer)
    for r in results:  # giant documents are counted per process; the first result carries the count
        r["large_documents"], r["forced_cuts"] = state["large_documents"], state["forced_cuts"]
        state["large_documents"] = state["forced_cuts"] = 0
    if results:
        results[0]["profile"] = {
            "pid": os.getpid(),
            "wall": round(time.perf_counter() - started, 4),
            "cpu": round(time.process_time() - cpu_started, 4),  # all of this process's threads
            "main_cpu": round(time.thread_time() - main_started, 4),  # this thread's: reading, waiting
            # the ids written past the page cache, and the seconds the disk took for them (`idsfile`)
            "ids_direct_bytes": pace.disk_bytes,
            "ids_direct_seconds": round(pace.disk_seconds, 4),
            **profile.take(),
            **state.pop("startup", {}),  # the process's first call: its start-up (`init_encoder`)
        }
    return results


def _timed(items, profile: Profile):
    """The items, with the time spent making each added to the profile's `read`."""
    it = iter(items)
    while True:
        t0, cpu = time.perf_counter(), time.thread_time()
        try:
            item = next(it)
        except StopIteration:
            return
        finally:
            profile.add("read", time.perf_counter() - t0)
            profile.add("read_cpu", time.thread_time() - cpu)
        yield item


def _close(current: list[Any], results: list[dict[str, Any]]) -> None:
    """Close the part's files (`current[1]`, then None: closed once, whatever happens); its result
    keeps the ids file's digests (`bin_digests`), for the store."""
    files, current[1] = current[1], None
    if files is None:
        return
    try:
        results[-1]["bin_digests"] = files[0].close()
    except BaseException:
        with contextlib.suppress(OSError):  # the same full disk: the ids file's error is the one
            files[1].close()
        raise
    files[1].close()


def _abandon(current: list[Any]) -> None:
    """Close the part's files after a failed write, nothing more written: the error on its way out
    is the first one, and the stage publishes nothing."""
    files, current[1] = current[1], None
    if files is not None:
        files[0].abandon()
        with contextlib.suppress(OSError):  # its buffer's flush hits the same full disk
            files[1].close()


def remember_ids_digests(out_dir: Path, results: list[dict[str, Any]]) -> None:
    """Hand the store the ids files' digests the writer took (`bin_digests`, taken off the results),
    so that publishing `out_dir` does not read those files back (`store.remember_digests`)."""
    for r in results:
        digests = r.pop("bin_digests", None)
        if digests is not None:
            remember_digests(out_dir / r["bin"], digests)


def encode_large(data: memoryview, eos_id: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """One giant document, in exact pieces where the tokenizer allows it (else whole)."""
    state["large_documents"] += 1
    piece_encoder = state["pieces"]
    if piece_encoder is None:
        ids = np.asarray(state["encode"]([bytes(data).decode("utf-8")], True)[0], dtype=np.uint32)
    else:
        ids, forced = piece_encoder.encode_document(data)
        if forced:
            log.warning(
                "a %d MB document has %d stretch(es) of %d MiB without a newline or space; cut there "
                "(ids next to such a cut may differ from transformers)",
                len(data) >> 20,
                forced,
                pieces.MAX_SEARCH_PIECES * pieces.PIECE_BYTES >> 20,
            )
        state["forced_cuts"] += forced
    flat = np.empty(len(ids) + 1, dtype=dtype)
    flat[:-1] = ids
    flat[-1] = eos_id
    return flat, np.array([len(flat)], dtype=np.int64)


def encode_part(job: PartJob) -> dict[str, int]:
    """One part, in a worker process."""
    return encode_parts([job])[0]


def _pipelined(
    items,
    fn,
    threads: int = 2,
    ahead: int = 2,
    profile: Profile | None = None,
    weigh: Callable[[Any], int] | None = None,
    renew_after: int = 0,
):
    """Yield fn(item) for each item in order, computed by `threads` helper threads, with up to
    `ahead` items taken and queued for them (at least `threads`).

    The encoders release the GIL, so two batches in flight keep every core busy through the tail
    of each batch (the longest documents) while this thread converts and writes.

    With `weigh` and `renew_after`, new helper threads take over once the items given to the
    current ones weigh `renew_after` (RENEW_THREADS_BYTES): the items in flight are finished
    first, and the old threads have ended (`_ended`) before the new ones start, so that what an
    engine kept per thread is freed and its memory reused by the new threads.
    """
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    def result(future):
        t0 = time.perf_counter()
        out = future.result()
        if profile is not None:
            profile.add("wait", time.perf_counter() - t0)
        return out

    started: list[int] = []  # the current helpers' OS thread ids

    def helpers() -> ThreadPoolExecutor:
        return ThreadPoolExecutor(
            threads, thread_name_prefix="moai-encode", initializer=lambda: started.append(threading.get_native_id())
        )

    ex = helpers()
    pending: deque = deque()
    given = 0  # weight given to the current helpers
    try:
        for item in items:
            if renew_after and given >= renew_after:
                while pending:
                    yield result(pending.popleft())
                ex.shutdown(wait=True)
                _ended(started)
                started.clear()
                ex, given = helpers(), 0
            pending.append(ex.submit(fn, item))
            given += weigh(item) if weigh is not None else 0
            if len(pending) > max(ahead, threads):
                yield result(pending.popleft())
        while pending:
            yield result(pending.popleft())
    finally:
        ex.shutdown(wait=True)


def _ended(thread_ids: list[int], timeout: float = 0.1) -> None:
    """Wait (at most `timeout` seconds each) until these OS threads of this process are gone.
    Python's join returns before a thread has run its native thread-local destructors (fastokens'
    caches) and before glibc has put its heap on the list that new threads take theirs from: a new
    thread started sooner may get a heap of its own while the memory freed in the old one stays
    resident. Without the wait that was left to timing (one run renewing every 64 MiB grew +154 MB
    over the corpus, against +113-125 with it)."""
    if not sys.platform.startswith("linux"):
        return
    for tid in thread_ids:
        deadline = time.perf_counter() + timeout
        while os.path.exists(f"/proc/self/task/{tid}") and time.perf_counter() < deadline:
            time.sleep(0.0002)


def split_sizes(text_dir: Path) -> dict[str, np.ndarray]:
    """Each split's text bytes a row (`text_bytes`): read once by the stage, for its parts, whether
    a document is large enough to be cut into pieces, and the megabytes of text."""
    return {split: text_bytes(open_split_table(text_dir, split)) for split in SPLITS}


def plan_parts(
    info: TokenizerInfo, text_dir: Path, out_dir: Path, batch_size: int, sizes: dict[str, np.ndarray] | None = None
) -> list[PartJob]:
    """Every part of every split, in order, writing under out_dir/<split>/. `sizes`: `split_sizes`,
    when the caller has them."""
    dtype = token_dtype(info.vocab_size)
    jobs: list[PartJob] = []
    sizes = sizes if sizes is not None else split_sizes(text_dir)
    for split in SPLITS:
        for i, (lo, hi) in enumerate(part_ranges(sizes[split])):
            jobs.append(PartJob(str(text_dir), split, i, lo, hi, str(out_dir), dtype.str, info.eos_id, batch_size))
    return jobs


def write_origins(text_dir: Path, out_dir: Path, parts: list[tuple[str, int, int, int]]) -> None:
    """Each part's `.origin` (int64 per document: the origin of the text row it was encoded from,
    -1 if unknown; `moai.formats.text`) from parts given as (split, index, start row, stop row),
    and the source's files (`origins.json`) beside tokens.json. Documents are rows in order, one
    document per row, so this reads the origin column only, never the text or the ids."""
    origins: dict[str, np.ndarray] = {}
    for split, index, start, stop in parts:
        if split not in origins:
            origins[split] = origins_of(open_split_table(text_dir, split))
        origins[split][start:stop].astype("<i8").tofile(out_dir / split / f"part-{index:05d}.origin")
    copy_origin_files(text_dir, out_dir)


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


def store_counts(splits: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts a token store's report gives, from `write_store_meta`'s summary and the parts."""
    docs = sum(s["num_documents"] for s in splits.values())
    return {
        "rows_in": docs,
        "rows_out": docs,
        "documents": docs,
        "tokens": sum(s["num_tokens"] for s in splits.values()),
        "splits": {k: {"documents": v["num_documents"], "tokens": v["num_tokens"]} for k, v in splits.items()},
        "large_documents": sum(r.get("large_documents", 0) for r in results),
        "forced_cuts": sum(r.get("forced_cuts", 0) for r in results),
    }
