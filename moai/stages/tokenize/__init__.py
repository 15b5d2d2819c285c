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
the corpus size; a document over 8 MiB (`pieces.LARGE_DOCUMENT_BYTES`) is read from the mapped file and encoded in
pieces at places where that gives the same ids (`pieces`), so one giant document does not
take the machine down either. Every document gets EOS appended after the tokenizer's own special
tokens, so a document's ids equal `tokenizer(text)["input_ids"] + [eos]`: before anything is
written, the chosen engine is checked against transformers itself on a sample of the corpus.

The package: `engine` (sampling the corpus, choosing and checking the encoder), `parts` (part
planning, encoding and writing parts, `tokens.json`), `pieces` (exact encoding of giant documents
in pieces), `tiktoken` (a tokenizer.json as a tiktoken encoding, when exact), `units` (the stage
as independent shard units and their merge). This module is the stage's public API and its
declaration in the stage graph (`moai.pipeline`): built locally, or, with the option
`num_shards`, merged from the parts `moai tokenize-shard` units published; both give the same
files under the same key.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import pickle
import resource
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moai.report import timing

# Constants are re-exported to be read; to change one, patch it in its module (`parts`, `pieces`).
from moai.stages.tokenize.engine import (
    VERIFY_BYTES,
    VERIFY_DOCUMENT_BYTES,
    VERIFY_DOCUMENTS,
    EncoderSetup,
    EngineChoice,
    Reference,
    check_pieces,
    choose_encoder,
    choose_engine,
    clear_encoder,
    has_large_documents,
    init_encoder,
    sample_texts,
    transformers_reference,
)
from moai.stages.tokenize.engines import FAST as FAST_ENGINES, size_fastokens_pool
from moai.stages.tokenize.parts import (
    BATCH_MAX_BYTES,
    MAX_PARTS,
    PART_MIN_BYTES,
    SPLITS,
    PartJob,
    documents_a_call,
    encode_documents,
    encode_large,
    encode_part,
    encode_parts,
    part_ranges,
    plan_parts,
    remember_ids_digests,
    split_sizes,
    store_counts,
    token_dtype,
    write_origins,
    write_store_meta,
)
from moai.stages.tokenizer import TokenizerInfo, info_of
from moai.workers import spawn_pool

if TYPE_CHECKING:  # a worker imports this package: it needs no pydantic
    from moai.config import PipelineConfig

__all__ = [
    "BATCH_MAX_BYTES",
    "MAX_PARTS",
    "PART_MIN_BYTES",
    "SPLITS",
    "VERIFY_BYTES",
    "VERIFY_DOCUMENTS",
    "VERIFY_DOCUMENT_BYTES",
    "VERSION",
    "WARM_UP_DOCUMENTS",
    "EncoderSetup",
    "EngineChoice",
    "PartJob",
    "Reference",
    "check_pieces",
    "choose_encoder",
    "choose_engine",
    "clear_encoder",
    "encode_documents",
    "encode_large",
    "encode_part",
    "encode_parts",
    "init_encoder",
    "part_ranges",
    "plan_parts",
    "sample_texts",
    "token_dtype",
    "tokenize",
    "transformers_reference",
    "write_store_meta",
]

log = logging.getLogger(__name__)

# 2: the backend runs as transformers runs it (no truncation/padding from tokenizer.json,
# split_special_tokens applied); giant documents in exact pieces; checked against transformers.
NAME = "tokenize"
VERSION = 3  # 3: a `.origin` beside each part, origins.json beside tokens.json
READS = ("save", "tokenizer")
WARM_UP_DOCUMENTS = 64


def _peak_rss_mb() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return round(own, 1), round(children, 1)


def tokenize(
    info: TokenizerInfo,
    text_dir: Path,
    out_dir: Path,
    *,
    num_proc: int,
    threads_per_proc: int,
    batch_size: int,
    engine: str = "auto",
    fast_split: tuple[int, int] | None = None,
    fast_batch_size: int | None = None,
    progress: bool = True,
    on_progress: Callable[[float], None] | None = None,
    reference: Reference | None = None,
    prefetched: Callable[[], tuple[list[str], Any] | None] | None = None,
    checked: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Tokenize every split of a saved DatasetDict folder into a token store in `out_dir`.

    `num_proc` × `threads_per_proc` is the split for tiktoken and `tokenizers`; `fast_split`
    (processes, threads) the one for fastokens and gigatoken, which run their own thread pools
    (default: the same); `batch_size` documents a call at most, `fast_batch_size` with those two
    (default: the same; either way a call takes at most ~BATCH_MAX_BYTES of text). `reference`
    gives transformers' ids of the sample (default: loaded here);
    `prefetched` gives the sample and those ids, made while save wrote `text_dir` (`reference`), or None;
    `checked` is called once the check has every id it asks of them."""

    entered = time.perf_counter()
    log.info(
        "tokenizer %s is fast (Rust tokenizers backend), vocab %d, EOS id %d",
        info.name_or_path,
        info.vocab_size,
        info.eos_id,
    )
    sizes = split_sizes(text_dir)  # read once: the parts, large documents, the text's size
    jobs = plan_parts(info, text_dir, out_dir, batch_size, sizes)

    def jobs_for(name: str) -> list[PartJob]:
        size = documents_a_call(name, batch_size, fast_batch_size)
        return jobs if size == batch_size else [dataclasses.replace(j, batch_size=size) for j in jobs]

    large = has_large_documents(text_dir, sizes)
    text_mb = sum(float(s.sum()) for s in sizes.values()) / 1e6
    classic = (max(1, min(num_proc, len(jobs))), threads_per_proc)
    fast = (max(1, min(fast_split[0], len(jobs))), fast_split[1]) if fast_split is not None else classic
    threads = (fast if engine_is_fast(engine) else classic)[1]
    size_fastokens_pool(fast[1])  # before this process's first fastokens encode
    for split in SPLITS:
        (out_dir / split).mkdir(parents=True, exist_ok=True)
    # What does not depend on the ids is done beside the check and the encoding, not after them:
    # each part's origins
    with ThreadPoolExecutor(1, thread_name_prefix="moai-origins") as beside:
        side = beside.submit(_origins, text_dir, out_dir, jobs)
        extra: dict[str, Any] = {}
        guess = None if large else _speculation(info, engine, fast, prefetched, threads)
        if guess is not None:
            # The check waits for transformers' ids of its sample (made during save, perhaps not yet
            # done): meanwhile the parts are encoded with the engine it keeps when that one is exact.
            # Nothing is published before the check passes; if it keeps another, all is encoded again.
            assert prefetched is not None, "a guess is made only when the sample's ids are made elsewhere"
            choice, sampled_ahead, check_seconds, started, results, again = _encode_beside_check(
                info,
                text_dir,
                jobs_for,
                engine,
                threads,
                reference,
                prefetched,
                checked,
                guess,
                progress,
                on_progress,
                large,
            )
            num_proc, threads_per_proc = 1, threads
            extra = {"check_beside_encoding": True, "encoded_twice": again}
        else:
            with contextlib.ExitStack() as stack:
                pool = None
                spawned_at = time.time()
                if classic[0] > 1 and not engines_fast_possible(engine):
                    # Workers start now (spawn, imports) while this process checks the engine; each builds
                    # its encoder from the checked set-up before its first part (`encode_part_with`).
                    pool = _start_pool(stack, *classic)
                check_started = time.perf_counter()
                ahead = prefetched() if prefetched is not None else None  # waits for them: part of the check
                choice = choose_encoder(info, text_dir, engine, threads, reference, ahead, large=large)
                if checked is not None:
                    checked()
                check_seconds = time.perf_counter() - check_started
                sampled_ahead = ahead is not None
                num_proc, threads_per_proc = fast if choice.engine in FAST_ENGINES else classic
                if choice.setup.threads != threads_per_proc:
                    choice = dataclasses.replace(
                        choice, setup=dataclasses.replace(choice.setup, threads=threads_per_proc), encoder=None
                    )
                if pool is None and num_proc > 1:
                    spawned_at = time.time()
                    pool = _start_pool(stack, num_proc, threads_per_proc)
                warm_up = choice.sample[:WARM_UP_DOCUMENTS]
                if pool is None:
                    init_encoder(choice.setup, None, warm_up, encoder=choice.encoder)
                else:
                    setup_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="moai-encoder-")))
                    setup_file = setup_dir / "setup.pickle"
                    setup_file.write_bytes(pickle.dumps((choice.setup, threads_per_proc, warm_up, spawned_at)))
                started = time.perf_counter()
                setup_path = None if pool is None else str(setup_file)
                results = _encode_all(jobs_for(choice.engine), pool, setup_path, started, progress, on_progress)
    encode_seconds = time.perf_counter() - started
    remember_ids_digests(out_dir, results)
    dtype = token_dtype(info.vocab_size)
    side.result()
    counts = store_counts(write_store_meta(info, out_dir, results), results)
    own_mb, workers_mb = _peak_rss_mb()
    whole = timing(text_mb, entered)  # the stage's table line: check, waits and files included
    return {
        **counts,
        **whole,
        "tokens_per_s": round(counts["tokens"] / whole["seconds"], 1) if whole["seconds"] > 0 else None,
        "encode_seconds": round(encode_seconds, 3),  # from the first part encoded with the kept engine
        "engine": choice.engine,
        "engine_reason": choice.engine_reason,
        "engines_tried": choice.engines_tried,
        "large_documents_whole": choice.pieces_reason,
        "processes": num_proc,
        "threads_per_process": threads_per_proc,
        "dtype": dtype.name,
        "peak_rss_mb": own_mb,
        "peak_worker_rss_mb": workers_mb if num_proc > 1 else None,
        "check_seconds": round(check_seconds, 3),
        "stage_seconds": whole["seconds"],  # the same as `seconds` now; the benchmarks read this name
        "check_sampled_ahead": sampled_ahead,  # sample and transformers' ids made during save
        "check_parts": choice.seconds,
        "profile": process_profiles(results),
        "warnings": info.warnings,
        **extra,
    }


def _origins(text_dir: Path, out_dir: Path, jobs: list[PartJob]) -> None:
    """Write each part's origins (`write_origins`)."""
    write_origins(text_dir, out_dir, [(j.split, j.index, j.start, j.stop) for j in jobs])


def _speculation(info, engine: str, fast: tuple[int, int], prefetched, threads: int):
    """(set-up, encoder) of the engine to encode with while the check waits for transformers' ids, or
    None: only when those ids are being made elsewhere (`prefetched`), the stage runs in this process,
    the engine is fastokens (the one `auto` tries first, or named) or gigatoken (named) and was built
    ahead. Not called when a document is large enough to be cut into pieces (whether that is exact
    is the check's to say)."""
    from moai.stages.tokenize import engine as engine_module, engines

    name = "fastokens" if engine == "auto" else engine
    if prefetched is None or fast[0] != 1 or name not in FAST_ENGINES:
        return None
    if engine == "auto" and engines.ENGINES[0].name != "fastokens":
        return None
    try:
        setup = engine_module.engine_setup(name, info, threads)
    except Exception:  # the check says why, as ever
        return None
    encoder = engines.take_prebuilt(setup)
    return None if encoder is None else (setup, encoder)


def _encode_beside_check(
    info, text_dir, jobs_for, engine, threads, reference, prefetched, checked, guess, progress, on_progress, large
):
    """Encode every part (`jobs_for` an engine) with the guessed engine while the check runs in a
    thread; keep the parts if the check keeps that engine, else encode them all again with the one
    it chose. Returns the choice, whether its sample came ahead, the check's seconds, when the kept
    encoding started, the parts' results, and whether they were encoded twice."""
    setup, encoder = guess

    def check():
        t0 = time.perf_counter()
        ahead = prefetched()
        built = {setup.engine: encoder}
        choice = choose_encoder(info, text_dir, engine, threads, reference, ahead, built=built, large=large)
        if checked is not None:
            checked()
        return choice, ahead is not None, time.perf_counter() - t0

    with ThreadPoolExecutor(1, thread_name_prefix="moai-check") as ex:
        # in this thread's context: the check's log lines go where the stage's go (a Prefect task's run)
        checking = ex.submit(contextvars.copy_context().run, check)
        init_encoder(setup, None, None, encoder=encoder)
        started = time.perf_counter()
        results = _encode_all(jobs_for(setup.engine), None, None, started, progress, on_progress)
        choice, sampled_ahead, check_seconds = checking.result()  # its error: nothing is published
    again = choice.engine != setup.engine
    if again:
        log.info("the check kept %s, not %s: encoding every part again with it", choice.engine, setup.engine)
        init_encoder(choice.setup, None, choice.sample[:WARM_UP_DOCUMENTS], encoder=choice.encoder)
        started = time.perf_counter()
        results = _encode_all(jobs_for(choice.engine), None, None, started, progress, on_progress)
    return choice, sampled_ahead, check_seconds, started, results, again


def engine_is_fast(engine: str) -> bool:
    return engine in FAST_ENGINES or engine == "auto"


def engines_fast_possible(engine: str) -> bool:
    """May the check pick a fast engine (then no pool is started before it: they need fewer processes)?"""
    import importlib.util

    names = FAST_ENGINES if engine == "auto" else FAST_ENGINES & {engine}
    return any(importlib.util.find_spec(n) is not None for n in names)


def _start_pool(stack: contextlib.ExitStack, num_proc: int, threads: int) -> ProcessPoolExecutor:
    return stack.enter_context(spawn_pool(num_proc, preload_worker, (threads,)))


def _encode_all(
    jobs: list[PartJob],
    pool: ProcessPoolExecutor | None,
    setup_file: str | None,
    started: float,
    progress: bool,
    on_progress: Callable[[float], None] | None,
) -> list[dict[str, Any]]:
    """Encode every part, in this process (no pool) or in the pool's workers; show progress."""
    from tqdm.auto import tqdm

    total_docs = sum(j.stop - j.start for j in jobs)
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

    results: list[dict[str, Any]] = []
    try:
        if pool is None:
            results = encode_parts(jobs, on_batch=advance)
        else:
            assert setup_file is not None, "a pool's workers build their encoder from the set-up file"
            futures = {pool.submit(encode_part_with, setup_file, job): job for job in jobs}
            for fut in as_completed(futures):
                r = fut.result()
                results.append(r)
                advance(r["num_documents"], r["num_tokens"])
    finally:
        bar.close()
        clear_encoder()  # drop this process's tokenizer and table maps (inline mode)
    return results


def preload_worker(rayon_threads: int) -> None:
    """A worker's start: the imports its parts need, while the main process checks the engine."""
    import os

    # Read by Rayon when its pool first starts, which is after this in a fresh worker.
    os.environ["RAYON_NUM_THREADS"] = str(rayon_threads)
    import tiktoken  # noqa: F401
    import tokenizers  # noqa: F401


def encode_part_with(setup_file: str, job: PartJob) -> dict[str, Any]:
    """One part in a worker; the worker's first part first builds its encoder from the checked
    set-up (`init_encoder`: EncoderSetup, threads, warm-up texts, when the pool started)."""
    from moai.stages.tokenize.engine import state

    if state.get("setup_file") != setup_file:
        import pickle

        with open(setup_file, "rb") as f:
            init_encoder(*pickle.load(f))
        state["setup_file"] = setup_file
    return encode_part(job)


def process_profiles(results: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per process that encoded parts: seconds by kind (`parts.Profile`), summed over its parts,
    with start-up (workers: from the pool's start to their encoder being warm) and wall."""
    by_pid: dict[int, dict[str, float]] = {}
    for r in results:
        prof = r.pop("profile", None)
        if prof is None:
            continue
        into = by_pid.setdefault(prof["pid"], {})
        for k, v in prof.items():
            if k != "pid":
                into[k] = round(into.get(k, 0.0) + v, 4)
    return list(by_pid.values())


# -- the stage in the graph (`moai.pipeline`) ----------------------------------------------------


def settings(config: PipelineConfig) -> dict[str, Any]:
    """Workers, threads, batch size do not change the output; the engine is checked to give the same
    ids. Chat data: the chat template's text (None: the tokenizer's own, in the tokenizer's key)."""
    if config.source is None or config.source.format != "chat":
        return {}
    from moai.stages.tokenize.chat import load_template

    return {"chat_template": load_template(config.source.chat_template)}


def build(ctx, out: Path) -> dict[str, Any]:
    from moai.stages.tokenize import units

    tok = ctx.inputs["tokenizer"]
    info = info_of(ctx.config, tok.path, tok.key)
    source = ctx.config.source
    if source is not None and source.format == "chat":
        return tokenize_chat_source(ctx.config, info, ctx.path("save"), out, sharded="num_shards" in ctx.options)
    if "num_shards" in ctx.options:
        return units.merge(ctx.store, ctx.key, info, ctx.path("save"), out, ctx.options["num_shards"] or None)
    from moai.stages.tokenize import reference

    p = ctx.plan
    ref = _reference(info)
    report = tokenize(
        info,
        ctx.path("save"),
        out,
        num_proc=p.num_proc.value,
        threads_per_proc=p.threads_per_proc.value,
        batch_size=p.batch_size.value,
        engine=ctx.config.tokenize.engine,
        fast_split=p.fast_engines.value,
        fast_batch_size=p.fast_batch_size.value,
        progress=ctx.progress,
        on_progress=ctx.on_progress,
        reference=None if ref is None else ref.ids,
        prefetched=None if ref is None else functools.partial(ref.prefetched, ctx.inputs["save"].key),
        checked=None if ref is None else functools.partial(reference.checked, ref),
    )
    if ref is not None and report["check_sampled_ahead"]:
        # of the sample's documents, how many transformers had encoded while filter ran (the rest: during save)
        report["check_sample_encoded_during_filter"] = ref.ready
    return report


def _reference(info: TokenizerInfo):
    """The process that loaded this tokenizer with transformers ahead of time, if one did."""
    from moai.stages.tokenize import reference

    return None if info.trust_remote_code else reference.for_folder(info.path)


def tokenize_chat_source(config: PipelineConfig, info: TokenizerInfo, text_dir: Path, out: Path, *, sharded: bool):
    """`source.format: chat`: rendered with the chat template, a loss mask beside the ids (`chat`)."""
    from moai.config import ConfigError
    from moai.stages.tokenize.chat import load_template, tokenize_chat
    from moai.stages.tokenizer import load_tokenizer

    if sharded:
        raise ConfigError("source.format chat is tokenized in one process: run moai prepare, not tokenize-shard units")
    assert config.source is not None
    template = load_template(config.source.chat_template)
    tokenizer = load_tokenizer(info.path or info.name_or_path, info.trust_remote_code)
    meta = {"tokenizer": info.name_or_path, "tokenizer_fingerprint": info.fingerprint}
    return tokenize_chat(tokenizer, template, info.eos_id, info.vocab_size, meta, text_dir, out)


def run_unit(
    config: PipelineConfig, key: str, inputs: dict[str, Any], *, shard_index: int, num_shards: int
) -> dict[str, Any]:
    """One `moai tokenize-shard` unit: encode and publish its parts of the stage output `key`."""
    from moai.hardware import data_plan
    from moai.stages.tokenize import units
    from moai.store import Store

    if config.source is not None and config.source.format == "chat":
        from moai.config import ConfigError

        raise ConfigError("source.format chat is tokenized in one process: run moai prepare, not tokenize-shard units")
    p = data_plan(config)
    tok = inputs["tokenizer"]
    return units.run_shard(
        Store(config.cache_dir),
        key,
        info_of(config, tok.path, tok.key),
        Path(inputs["save"].path),
        shard_index=shard_index,
        num_shards=num_shards,
        batch_size=p.batch_size.value,
        threads=p.threads_per_proc.value * p.num_proc.value,
        engine=config.tokenize.engine,
        fast_batch_size=p.fast_batch_size.value,
    )
