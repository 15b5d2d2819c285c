"""transformers' side of the check, in a process of its own, started before the stages that need it.

A cold run pays 1.5–9 s to import transformers and load a large tokenizer before it can compare
a single id, and none of that depends on the text. `prefetch(config)` starts a spawned process
that loads the given tokenizer folder while convert, filter and save run on the other cores (on a
cold cache `moai prepare` starts it before its preflight checks: `walk.prepare`), with torch
hidden from transformers (`_hide_torch`; a folder that needs it is loaded again with it). The
tokenizer stage then takes the tokenizer's description from it (`describe`), and the tokenize
stage transformers' own ids of its sample (`ids`): the check is the same check, only
the process transformers runs in changed, and nothing is published before the ids match.

The check's sample is made here too, before the tokenize stage needs it. When filter starts, it
tells the process where it reads from (`candidates_ahead`): the process encodes the documents of
convert's output the check will most likely sample (`engine.candidate_texts`: the sample is chosen
by the rows' origins, so rows dropped in between hardly change it) on the core filter leaves free.
When save starts (`sample_ahead`), the process reads the exact sample of the train split save is
about to write (the rows `engine.sample_texts` reads from save's output: save copies every text and
origin as it is and picks validation rows by a function of the row count) and encodes only the
documents it lacks. The tokenize stage then takes the sample and its ids (`prefetched`, by save's
key) instead of sampling and waiting for transformers: 0.03-0.06 s of checking left on a 565 MB
corpus, 0.51 s before (`docs/performance.md`).

Once the last tokenize stage of the run has its check's answer (`checked`), the process ends: the
~600 MB transformers holds go back to the system while that stage still encodes and writes.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moai.errors import TokenizerError
from moai.stages.tokenize import engines
from moai.workers import interrupts_left_to_parent

if TYPE_CHECKING:
    from moai.config import PipelineConfig
    from moai.hardware import Plan
    from moai.stages.tokenizer import TokenizerInfo

log = logging.getLogger("moai.stages.tokenize")


def _files_fingerprint(folder: Path) -> str:
    from moai.stages.tokenizer import store_files
    from moai.store import fingerprint_files

    skip = store_files()
    return fingerprint_files(sorted(p for p in folder.iterdir() if p.is_file() and p.name not in skip))


def _serve(conn, folder: str, without_torch: bool = False, compare_file: bool = False, affixes: bool = False) -> None:
    """The reference process: load the tokenizer, send its description, then answer id requests.
    `without_torch`: transformers is imported with torch hidden (`_hide_torch`); a folder that
    does not load so is answered with "retry", and the parent starts a process with torch.
    `compare_file`: the description comes with whether the folder's tokenizer.json is the pipeline
    loaded (`_file_is_pipeline`); else with False. `affixes`: and with the ids its post-processor
    puts around a text (`engine.affixes_of`, for gigatoken: found here, the parent's GIL stays free)."""
    logging.getLogger("moai").addHandler(logging.NullHandler())  # the parent logs what matters
    if without_torch:
        _hide_torch()
    try:
        from moai.stages.tokenizer import describe, load_tokenizer

        tok = load_tokenizer(folder)
        info = describe(tok, folder, "", path=folder)
        same = compare_file and _file_is_pipeline(tok, Path(folder))
        found = None
        if affixes:
            with contextlib.suppress(Exception):  # the parent finds them itself (and the check says why)
                from moai.stages.tokenize.engine import affixes_of

                found = affixes_of(info.backend_json)
        conn.send(("info", (info, same, found)))
    except BaseException as err:  # sent to the parent, which raises it where the stage needs it
        text = f"{type(err).__name__}: {err}" if not isinstance(err, TokenizerError) else str(err)
        conn.send(("retry" if without_torch else "error", text))
        return
    samples: dict[str, Any] = {}  # tag -> (sample texts, transformers' ids as a Flat, how many were ready), or None
    known: dict[str, list[int]] = {}  # text -> transformers' ids, encoded ahead ("candidates")

    def ids_of(texts: list[str]) -> list[list[int]]:
        new = list(dict.fromkeys(t for t in texts if t not in known))
        if new:
            known.update(zip(new, tok(new, verbose=False)["input_ids"], strict=True))
        return [known[t] for t in texts]

    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        if isinstance(request, tuple) and request[0] == "candidates":  # no answer: ids kept for "sample"
            with contextlib.suppress(Exception):  # whatever fails, "sample" encodes what it needs
                from moai.stages.tokenize.engine import candidate_texts

                if len(known) > 20_000:  # many sources: keep memory bounded (a miss only costs time)
                    known.clear()
                ids_of(candidate_texts(Path(request[1])))
        elif isinstance(request, tuple) and request[0] == "sample":  # no answer: kept for "get_sample"
            _, tag, in_dir, split = request
            try:
                from moai.stages.tokenize.engine import sample_texts_before_save

                texts = sample_texts_before_save(Path(in_dir), split)
                ready = sum(t in known for t in texts)
                samples[tag] = (texts, engines.flat_of(ids_of(texts)), ready)
            except Exception:  # the stage samples and asks again itself
                samples[tag] = None
        elif isinstance(request, tuple) and request[0] == "get_sample":
            conn.send(("sample", samples.pop(request[1], None)))
        else:
            conn.send(("ids", tok(request, verbose=False)["input_ids"] if request else []))


def _file_is_pipeline(tok, folder: Path) -> bool:
    """Is the folder's tokenizer.json, as it is, the pipeline transformers loaded? Yes when its text
    is what the backend writes of itself (`to_str(pretty=True)`, as `tokenizers` saves a file), all
    but the whitespace at either end: then fastokens built from that file (`_build_ahead`, while
    transformers still loads) encodes as fastokens built from transformers' pipeline. A file written
    otherwise, or a pipeline transformers changed, gives no: fastokens is built again from the
    pipeline. ~0.15 s for a 131k vocabulary, here, not in the run's process (parsing both texts
    there held its GIL ~0.9 s)."""
    try:
        text = (folder / "tokenizer.json").read_text(encoding="utf-8")
        return text.strip() == tok.backend_tokenizer.to_str(pretty=True).strip()
    except Exception:  # no file, or one that is not UTF-8: built from the pipeline
        return False


def _hide_torch() -> None:
    """Make `import torch` fail in this (fresh) process, so that transformers runs without it: its
    tokenizers need none of torch, whose import was 0.75 s of the 2.4 s transformers took to load
    Tekken here, beside convert on the same cores. A 68 MB cold `moai prepare` then waited 0.04-0.1 s
    for the tokenizer instead of 1.2-1.3 s (`docs/tokenize-engines.md`)."""
    import os
    import sys

    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # the documented way to block an import
        os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"  # its "PyTorch was not found" line


class Reference:
    """A tokenizer folder loaded by transformers in another process: without torch, or, where the
    folder does not load so, with it (`without_torch` says which)."""

    def __init__(self, folder: Path, uses: int | None = None, compare_file: bool = False, affixes: bool = False):
        self.folder = folder
        self.compare_file = compare_file  # learn whether the folder's file is the pipeline (`_serve`)
        self.want_affixes = affixes  # and the post-processor's affixes (`_serve`), here as `affixes`
        self.affixes: Any = None
        self.uses = uses  # tokenize stages of the run that will check against it (None: unknown)
        self.fingerprint = _files_fingerprint(folder)
        self._info: Any = None
        self.file_is_pipeline = False  # the folder's tokenizer.json is transformers' pipeline as it is
        self.ready: int | None = None  # of the last sample taken, documents transformers encoded ahead
        self._lock = threading.Lock()  # one request and its answer at a time (the prebuild thread asks too)
        self._send_lock = threading.Lock()  # one message being sent at a time
        self._close_lock = threading.Lock()
        self._closed = False
        self._start(without_torch=True)

    def _start(self, without_torch: bool) -> None:
        ctx = get_context("spawn")
        conn, child = ctx.Pipe()
        process = ctx.Process(
            target=_serve,
            args=(child, str(self.folder), without_torch, self.compare_file, self.want_affixes),
            daemon=True,
            name="moai-reference",
        )
        with interrupts_left_to_parent():  # Ctrl-C: one line from the parent, which kills this process
            process.start()
        child.close()
        self.conn, self.process, self.without_torch = conn, process, without_torch

    def _recv(self) -> Any:
        while True:
            try:
                kind, value = self.conn.recv()
            except EOFError:
                raise TokenizerError(
                    f"the process loading tokenizer {str(self.folder)!r} with transformers ended without an answer "
                    f"(exit code {self.process.exitcode})"
                ) from None
            if kind == "retry":  # the folder did not load without torch: again, with it
                log.info("transformers did not load %s without torch (%s); loading it with torch", self.folder, value)
                with self._send_lock, self._close_lock:
                    if self._closed:
                        raise TokenizerError(f"the process loading tokenizer {str(self.folder)!r} was closed")
                    self.process.join()
                    self.conn.close()
                    self._start(without_torch=False)
                continue
            if kind == "error":
                raise TokenizerError(value)
            return value

    def info(self, name_or_path: str, fingerprint: str = "") -> TokenizerInfo:
        """`describe` of the loaded tokenizer, as this folder's (warnings logged here)."""
        import dataclasses

        with self._lock:
            if self._info is None:
                try:
                    self._info, self.file_is_pipeline, self.affixes = self._recv()
                except TokenizerError as err:
                    self._info = err  # every later caller gets the same error
                if not isinstance(self._info, TokenizerError):
                    for w in self._info.warnings:
                        log.warning(w)
            if isinstance(self._info, TokenizerError):
                raise TokenizerError(str(self._info))
        return dataclasses.replace(self._info, name_or_path=name_or_path, fingerprint=fingerprint)

    def ids(self, texts: list[str]) -> list[list[int]]:
        """`tokenizer(texts)["input_ids"]`, computed by transformers in the reference process."""
        self.info(str(self.folder))
        with self._lock:
            self._send(texts)
            return self._recv()

    def prefetched(self, tag: str) -> tuple[list[str], engines.Flat] | None:
        """The sample of save output `tag` and transformers' ids of it (`sample_ahead`; waits for
        them), or None when none was asked for or making it failed."""
        self.info(str(self.folder))
        with self._lock:
            self._send(("get_sample", tag))
            made = self._recv()
        if made is None:
            return None
        texts, ids, ready = made
        log.info("the check's sample: %d documents, %d of them encoded by transformers ahead", len(texts), ready)
        self.ready = ready
        return texts, ids

    def _send(self, message: Any) -> None:
        with self._send_lock:
            self.conn.send(message)

    def close(self) -> None:
        """End the process now: it holds nothing to save, and a clean exit of transformers and torch
        takes ~1 s that a finished run would wait for."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self.process.kill()
            self.process.join()
            self.conn.close()


_running: list[Reference] = []
_uses_lock = threading.Lock()


def checked(ref: Reference) -> None:
    """A tokenize stage's check has transformers' ids from `ref` and asks nothing more. After the
    last such stage of the run (`Reference.uses`), the process is ended now, in the background:
    what it holds (~600 MB for a 131k vocabulary) is freed while that stage writes its ids, and the
    pages the system gets back are those the ids' files are then written into."""
    with _uses_lock:
        if ref.uses is None:
            return
        ref.uses -= 1
        if ref.uses > 0:
            return
        if ref in _running:
            _running.remove(ref)
    threading.Thread(target=ref.close, daemon=True, name="moai-reference-close").start()


def for_folder(folder: str | Path) -> Reference | None:
    """The running reference process whose folder's files are byte-identical to `folder`'s, if any."""
    if not _running:
        return None
    path = Path(folder)
    if not path.is_dir():
        return None
    fp = _files_fingerprint(path)
    return next((r for r in _running if r.fingerprint == fp and r.process.is_alive()), None)


def _wanted(config: PipelineConfig) -> Path | None:
    """The local tokenizer folder a cold run of `config` will load with transformers, if it may be
    loaded ahead (no remote code, no chat template rendering in the process)."""
    tcfg = config.tokenizer
    if tcfg.path is None or tcfg.trust_remote_code:
        return None
    sources: list[Any] = [config.source, *(config.sources or [])]
    if any(s is not None and s.format == "chat" for s in sources):
        return None
    folder = Path(tcfg.path).expanduser()
    if not (folder / "tokenizer.json").is_file() or any(p.is_dir() for p in folder.iterdir()):
        return None
    return folder


def candidates_ahead(in_dir: Path) -> None:
    """The filter stage starts from `in_dir` (convert's output): every running reference process
    encodes the documents the check will most likely sample (`engine.candidate_texts`), on the core
    filter leaves free."""
    _tell(("candidates", str(in_dir)))


def sample_ahead(tag: str, in_dir: Path, split: Any) -> None:
    """The save stage (output `tag`) starts writing from `in_dir`: every running reference process
    samples what it will write and encodes what it lacks of the sample meanwhile (`prefetched`)."""
    _tell(("sample", tag, str(in_dir), split))


def _tell(message: tuple) -> None:
    """Send a request that has no answer (so never waits for another) to every running process."""
    for ref in _running:
        if ref.process.is_alive():
            with contextlib.suppress(OSError):  # the process ended: the stage samples itself (and says why)
                ref._send(message)


@contextlib.contextmanager
def prefetch(config: PipelineConfig, plan: Plan | None = None) -> Iterator[Reference | None]:
    """Load the config's tokenizer with transformers in another process for the length of the
    block. `plan`: the run's (default: the one `run_stage` makes), for the threads of fastokens'
    pool, which is started ahead too."""
    folder = _wanted(config)
    if folder is None:
        yield None
        return
    from moai.pipeline.graph import nodes

    named = config.tokenize.engine
    small = named in ("auto", "fastokens") and _small(config)
    uses = sum(n.stage.name == "tokenize" for n in nodes(config))
    ref = Reference(folder, uses=uses, compare_file=small, affixes=named == "gigatoken")
    _running.append(ref)
    # Meanwhile the fastest engine is built before it is needed (parsing a 131k vocabulary takes
    # fastokens ~1.1 CPU-s): for a small run at once from the folder's file (`_prebuild`), else from
    # the pipeline transformers loaded. The check still decides whether it is used. In this thread's
    # context, so its log lines (the tokenizer's warnings) go where the run's go.
    run = contextvars.copy_context().run
    ended, stop = engines.prebuild_begins(), threading.Event()
    file = engines.file_build_begins(folder / "tokenizer.json") if small else None
    args = (_prebuild, ref, ended, config, plan, stop, file, named)
    builder = threading.Thread(target=run, args=args, daemon=True, name="moai-prebuild")
    builder.start()
    try:
        yield ref
    finally:
        stop.set()
        with _uses_lock:
            if ref in _running:
                _running.remove(ref)
        ref.close()  # a prebuild waiting for the description gets EOF now
        # It may be in fastokens (Rust) code: a thread still there when Python exits is unwound by
        # force and the process aborts ("FATAL: exception not rethrown"). It stops at its next step.
        builder.join()
        engines.drop_prebuilt()


@contextlib.contextmanager
def prefetch_when_building(config: PipelineConfig, plan: Plan | None = None) -> Iterator[Callable[[], None]]:
    """`prefetch` from the first stage the run builds, for the rest of the block: call the function
    it gives before building a stage. A run that reuses every stage starts no transformers process
    (before, it started one for nothing: ~2.5 CPU-s and ~650 MB on a cached 601 MB corpus)."""
    with contextlib.ExitStack() as stack:
        started = False

        def building() -> None:
            nonlocal started
            if not started:
                started = True
                stack.enter_context(prefetch(config, plan))

        yield building


def _prebuild(
    ref: Reference,
    ended: Callable[[], None],
    config: PipelineConfig,
    plan: Plan | None,
    stop: threading.Event,
    file: engines.FileBuild | None = None,
    named: str = "auto",
) -> None:
    """Build fastokens, ready to encode (`engines.prebuild`), while the stages before tokenize
    run. Each step first looks at `stop` (the run is over). With `tokenize.engine: gigatoken`
    (`named`), gigatoken instead, once transformers has loaded the folder: the stage then encodes
    with it beside the check as it does with fastokens.

    - With `file` (a small run, `_small`): at once from the folder's tokenizer.json. The preflight
      counts its sample with it (`engines.file_counts`) instead of loading the file with
      `tokenizers`, and the stage takes it when the reference process finds that the file is, as
      it is, the pipeline transformers loaded (`_file_is_pipeline`); else it is built again from
      that pipeline.
    - Else once transformers has loaded the folder, from the pipeline it runs: in a large run the
      build then overlaps convert, and the preflight does not wait for it.

    Measured on 2 cores with Tekken (131k), cold `moai prepare`, alternated runs, 2026-11-27
    (docs/tokenize-engines.md): 68 MB 4.1-4.4 s built late, 3.2-3.6 s built at once; 150 MB
    4.0-4.4 s against 3.6-3.9 s; 300 MB 4.6-5.4 s against 5.0-5.3 s, the stage 1.1-1.45 s (most
    of it waiting for the late build) against 0.7-1.0 s; 601 MB 6.5-7.5 s against 7.1-7.9 s.
    Comparing the two JSON texts in this process instead held the GIL ~0.9 s of convert (docs/tokenize-engines.md)."""
    try:
        if named == "gigatoken":
            _build_gigatoken_ahead(ref, _fast_threads(config, plan), stop)
        elif named in ("auto", "fastokens"):
            _build_ahead(ref, _fast_threads(config, plan), stop, file)
    finally:
        ended()


# A run whose local sources hold at most this much builds fastokens at once (`_prebuild`): its
# tokenize stage would otherwise start before the build that begins once transformers has loaded.
SMALL_RUN_BYTES = 384 << 20


def _small(config: PipelineConfig) -> bool:
    """Do the run's sources hold at most SMALL_RUN_BYTES of text, all of them local files?"""
    from moai.preflight import source_settings
    from moai.stages.convert.compressed import text_bytes
    from moai.stages.convert.readers import source_files

    try:
        total = 0
        for _, src in source_settings(config):
            if src.hub is not None or "://" in str(src.path):
                return False
            total += text_bytes(source_files(src))
        return total <= SMALL_RUN_BYTES
    except Exception:  # the preflight says what is wrong with the sources
        return False


def _fast_threads(config: PipelineConfig, plan: Plan | None) -> int | None:
    """The threads a tokenize process of this run gives fastokens (the plan's `fast_engines`)."""
    from moai.hardware import data_plan

    try:
        return int((plan or data_plan(config)).fast_engines.value[1])
    except Exception:  # the stage sizes the pool itself, before its first encode
        return None


def _build_ahead(ref: Reference, threads: int | None, stop: threading.Event, file: engines.FileBuild | None) -> None:
    with contextlib.suppress(Exception):  # whatever fails here fails again, reported, in the check
        early = engines.build_file(file, threads, stop) if file is not None else None
        info = ref.info(str(ref.folder))
        if file is not None and not ref.file_is_pipeline:
            engines.file_build_dropped(file)  # not what transformers runs: ~210 MB for 131k, freed first
            early = None
        if not stop.is_set():
            engines.prebuild(info.backend_json, info.split_special_tokens, info.eos_id, threads, early)


def _build_gigatoken_ahead(ref: Reference, threads: int | None, stop: threading.Event) -> None:
    """gigatoken for `tokenize.engine: gigatoken`, given the plan's threads (unknown: built by the check)."""
    from moai.stages.tokenize.engine import engine_setup, known_affixes

    with contextlib.suppress(Exception):  # whatever fails here fails again, reported, in the check
        info = ref.info(str(ref.folder))
        if ref.affixes is not None:
            known_affixes(info.backend_json, ref.affixes)
        if threads is not None and not stop.is_set():
            engines.prebuild_gigatoken(engine_setup("gigatoken", info, threads))
