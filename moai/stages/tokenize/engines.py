"""The tokenize engines: one table, fastest first, each checked against transformers before use.

An engine turns a batch of texts into the ids transformers gives (`tokenizer(text)["input_ids"]`)
as one flat uint32 array and document offsets (`Flat`), with no Python int per token where the
engine allows it. `ENGINES` lists them in the order `auto` tries them; the order comes from
measurement (`benchmarks/prepare_e2e.py`, docs/tokenize-engines.md): on 2 cores, over transformers' own
call, fastokens ran 7–75×, gigatoken 7–12×, tiktoken ~2× and `tokenizers` 0.5–2.5× on six
production tokenizer families. `auto` keeps the first one whose ids equal transformers' on
every sampled document (`engine.choose_engine`); the others get a one-line reason each.

Adding an engine is one class here and one line in `ENGINES`. `build` raises `NotExpressible`
(the engine cannot run this tokenizer exactly: said before trying), `ImportError` (not installed)
or any error of the engine's own loader; each becomes that engine's reason in the stage report.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from moai import heap
from moai.stages.tokenize.tiktoken import NotExpressible

if TYPE_CHECKING:
    from moai.stages.tokenize.engine import EncoderSetup

Flat = tuple[np.ndarray, np.ndarray]  # (uint32 ids of every text, int64 offsets: len(texts) + 1)


def flat_of(ids: list[Any]) -> Flat:
    """`Flat` from one id sequence (list or array) per text."""
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    if ids:
        np.cumsum([len(x) for x in ids], out=offsets[1:])
        flat = np.concatenate([np.asarray(x, dtype=np.uint32) for x in ids])
    else:
        flat = np.empty(0, dtype=np.uint32)
    return flat, offsets


def lists_of(flat: Flat) -> list[list[int]]:
    ids, offsets = flat
    return [ids[a:b].tolist() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


def check_ends(flat: Flat, token: int) -> None:
    """A RuntimeError naming the first text whose ids do not end with `token`, if any."""
    ids, offsets = flat
    if len(offsets) < 2:
        return
    wrong = np.flatnonzero(ids[offsets[1:] - 1] != token)
    if len(wrong):
        raise RuntimeError(f"text {int(wrong[0])} does not end with id {token}")


def unwrap_suffix(flat: Flat, token: int) -> Flat:
    """`flat` without the last id of every text, which must be `token` (else a RuntimeError)."""
    check_ends(flat, token)
    ids, offsets = flat
    keep = np.ones(len(ids), dtype=bool)
    keep[offsets[1:] - 1] = False
    return ids[keep], offsets - np.arange(len(offsets), dtype=np.int64)


def wrap(flat: Flat, prefix: tuple[int, ...] = (), suffix: tuple[int, ...] = ()) -> Flat:
    """Every text's ids with `prefix` before and `suffix` after them, in NumPy (no loop over texts):
    the affixes' slots are marked in a byte mask and the ids poured into the rest in order."""
    ids, offsets = flat
    n, p, s = len(offsets) - 1, len(prefix), len(suffix)
    if n <= 0 or p + s == 0:
        return flat
    lengths = np.diff(offsets)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths + (p + s), out=out_offsets[1:])
    out = np.empty(int(out_offsets[-1]), dtype=ids.dtype)
    body = np.ones(len(out), dtype=bool)
    for k, t in enumerate(prefix):
        out[out_offsets[:-1] + k] = t
        body[out_offsets[:-1] + k] = False
    for k, t in enumerate(suffix):
        out[out_offsets[1:] - s + k] = t
        body[out_offsets[1:] - s + k] = False
    out[body] = ids[offsets[0] : offsets[-1]]
    return out, out_offsets


class Encoder(Protocol):
    name: str

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """One list of ids per text (the checks and the piece encoder use this)."""
        ...

    def encode_flat(self, texts: list[str], add_special_tokens: bool = True) -> Flat:
        """All texts' ids as one array (the check compares these with transformers')."""
        ...

    def encode_documents(self, texts: list[str], eos_id: int) -> Flat:
        """`encode_flat(texts, True)` with `eos_id` after every text: what the parts store."""
        ...


class _Documents:
    def encode_flat(self, texts: list[str], add_special_tokens: bool = True) -> Flat:
        raise NotImplementedError

    def encode_documents(self, texts: list[str], eos_id: int) -> Flat:
        return wrap(self.encode_flat(texts, True), suffix=(eos_id,))


class _FromLists(_Documents):
    """`encode_flat` from `encode` (engines that hand out lists)."""

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        raise NotImplementedError

    def encode_flat(self, texts: list[str], add_special_tokens: bool = True) -> Flat:
        return flat_of(self.encode(texts, add_special_tokens))


class _FromFlat(_Documents):
    """`encode` from `encode_flat` (engines that hand out arrays)."""

    def encode_flat(self, texts: list[str], add_special_tokens: bool = True) -> Flat:
        raise NotImplementedError

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return lists_of(self.encode_flat(texts, add_special_tokens))


class TokenizersEncoder(_FromLists):
    """The Rust `tokenizers` pipeline as transformers runs it: the reference library itself."""

    name = "tokenizers"

    def __init__(self, setup: EncoderSetup):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(setup.backend_json)
        self.tok.no_truncation()
        self.tok.no_padding()
        # transformers sets this on every call from tokenizer_config.json's split_special_tokens;
        # it is not part of tokenizer.json.
        self.tok.encode_special_tokens = setup.split_special_tokens

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]


class TiktokenEngine(_FromLists):
    """tiktoken, from the tokenizer.json translated into its ranks (`tiktoken.spec_from_tokenizer_json`)."""

    name = "tiktoken"

    def __init__(self, setup: EncoderSetup):
        from moai.stages.tokenize.tiktoken import TiktokenEncoder

        if setup.spec is None:
            raise NotExpressible("no tiktoken spec")
        self.enc = TiktokenEncoder(setup.spec, setup.threads)

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return self.enc.encode_batch(texts, add_special_tokens)

    def encode_flat(self, texts: list[str], add_special_tokens: bool = True) -> Flat:
        if not add_special_tokens:
            return flat_of(self.encode(texts, False))
        return flat_of(self.enc.encode_arrays(texts))  # straight from tiktoken's buffers


class FastokensEncoder(_FromFlat):
    """fastokens: the tokenizer.json in its own Rust BPE; `encode_batch_flat` hands back one
    little-endian uint32 buffer and uint64 offsets (no Python object per token).

    With the set-up's `eos_id`, its post-processor is made to put EOS after the tokenizer's own
    special tokens (at the end of the tokenizer's own template, else in a TemplateProcessing step
    after its post-processor), so the parts store its buffer as it comes (`encode_documents`:
    every text's last id is checked to be EOS, no copy), and `encode_flat` takes that EOS off
    again: the check compares exactly what this call gives. Where neither gives the same ids plus
    EOS on a probe, the post-processor is put back and EOS goes in by NumPy (`wrap`). EOS is set
    at the first call (`ready`), after `size_fastokens_pool`: any encode starts fastokens' pool."""

    name = "fastokens"

    @property
    def caches_per_thread(self) -> bool:
        """Does each thread that calls it keep a cache of its own? With a pool of one thread
        (`size_fastokens_pool`) a call runs on the calling thread, which keeps fastokens' word cache
        until it ends: the parts renew their threads (`parts.RENEW_THREADS_BYTES`)."""
        import os

        return os.environ.get("FASTOKENS_BPE_THREADS") == "1"

    def __init__(self, setup: EncoderSetup, tok: Any = None):
        """`tok`: fastokens' tokenizer of `setup.backend_json`, already built (`prebuild`)."""
        self.tok = tok if tok is not None else fastokens_tokenizer(setup.backend_json)
        self.tok.no_truncation()
        self.tok.no_padding()
        self.split = setup.split_special_tokens
        self.eos: int | None = None  # the id the post-processor appends (set by `ready`)
        self._pending_eos = setup.eos_id

    def _call(self, texts: list[str], special: bool) -> Flat:
        ids, offsets = self.tok.encode_batch_flat(texts, add_special_tokens=special, split_special_tokens=self.split)
        return np.frombuffer(ids, dtype="<u4"), np.frombuffer(offsets, dtype="<u8").astype(np.int64)

    def ready(self) -> None:
        """Append the EOS step and probe it (the tokenizer's first encode, ~25 ms), once; every
        call does it first. `prebuild` does it ahead, off the stage's path (with it the stage's
        encode threads waited on the check's first call, 0.03-0.1 s into the stage)."""
        if self._pending_eos is None:
            return
        with _changing:  # not while the preflight counts with the same tokenizer (`file_counts`)
            if self._pending_eos is not None:
                self.eos = self._append_eos(self._pending_eos)
                self._pending_eos = None

    def _append_eos(self, eos_id: int) -> int | None:
        """Add EOS to the post-processor; eos_id if the probe gives the same ids plus EOS. Folded
        into the tokenizer's own template where its last step is one (`eos_in_template`: one pass
        over each document's ids instead of two, 3% of fastokens' time with a Llama-3-style BOS
        template), else a step after it."""
        token = self.tok.id_to_token(eos_id)
        if token is None:
            return None
        probe = ["a", "", " hello\n"]
        want = wrap(self._call(probe, True), suffix=(eos_id,))
        own = self.tok.post_processor
        own_json = json.loads(str(own)) if own is not None else None
        a = {"Sequence": {"id": "A", "type_id": 0}}
        step = {
            "type": "TemplateProcessing",
            "single": [a, {"SpecialToken": {"id": token, "type_id": 0}}],
            "pair": [a, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {token: {"id": token, "ids": [eos_id], "tokens": [token]}},
        }
        after = {"type": "Sequence", "processors": [own_json, step] if own_json is not None else [step]}
        folded = eos_in_template(own_json, token, eos_id)
        for candidate in [folded, after] if folded is not None else [after]:
            try:
                self.tok.post_processor = json.dumps(candidate)
                got = self._call(probe, True)
                if all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)):
                    return eos_id
            except Exception:  # this fastokens cannot: the next way, or EOS goes in by NumPy
                pass
        self.tok.post_processor = None if own is None else str(own)
        return None

    def encode_flat(self, texts: list[str], add_special_tokens: bool = True) -> Flat:
        self.ready()
        flat = self._call(texts, add_special_tokens)
        if add_special_tokens and self.eos is not None:
            return unwrap_suffix(flat, self.eos)
        return flat

    def encode_documents(self, texts: list[str], eos_id: int) -> Flat:
        self.ready()
        if self.eos != eos_id:
            return super().encode_documents(texts, eos_id)
        flat = self._call(texts, True)
        try:
            check_ends(flat, eos_id)
        except RuntimeError as err:
            raise RuntimeError(f"fastokens' post-processor left out EOS after a document: {err}") from None
        return flat


def eos_in_template(post_processor: dict | None, token: str, eos_id: int) -> dict | None:
    """A post-processor (tokenizers' JSON) whose last step is a TemplateProcessing, with EOS added
    at the end of that template's single sequence; None when it has no such step. It gives the
    tokenizer's own ids plus EOS (probed before use, and checked with the rest)."""
    if post_processor is None:
        return None
    if post_processor.get("type") == "Sequence" and post_processor.get("processors"):
        *head, last = post_processor["processors"]
        inner = eos_in_template(last, token, eos_id)
        return None if inner is None else {**post_processor, "processors": [*head, inner]}
    if post_processor.get("type") != "TemplateProcessing":
        return None
    specials = dict(post_processor.get("special_tokens") or {})
    if token in specials and list(specials[token].get("ids", [])) != [eos_id]:
        return None  # the name stands for other ids in this template
    specials.setdefault(token, {"id": token, "ids": [eos_id], "tokens": [token]})
    single = [*post_processor["single"], {"SpecialToken": {"id": token, "type_id": 0}}]
    return {**post_processor, "single": single, "special_tokens": specials}


class GigatokenEncoder(_FromFlat):
    """gigatoken: its native batch call (an awkward array of uint32 ids), with the post-processor's
    ids (BOS, EOS) put around each text here: the native call does not add them. The parts hand it
    the saved Arrow text itself (`takes_arrow`: read in place, `_awkward`); the check, `str`s."""

    name = "gigatoken"
    takes_arrow = True  # the parts hand it Arrow text (`encode_documents`), not `str`s

    def __init__(self, setup: EncoderSetup):
        if setup.split_special_tokens:
            raise NotExpressible("split_special_tokens (gigatoken has no switch for it)")
        import gigatoken

        self.tok = gigatoken.Tokenizer.from_json(setup.backend_json)
        self.parallel = setup.threads > 1
        self.prefix, self.suffix = setup.affixes

    def encode_documents(self, texts: list[str], eos_id: int) -> Flat:
        return wrap(self.encode_flat(texts, False), self.prefix, (*self.suffix, eos_id))  # one copy, not two

    def encode_flat(self, texts: list[str] | Any, add_special_tokens: bool = True) -> Flat:
        """`texts`: `str`s, or an Arrow string array without nulls (read in place)."""
        import awkward as ak

        if isinstance(texts, list):
            # as Arrow too: given `str`s its call took ~4x longer beside a busy Python thread (the check
            # beside the encoding: 7 against 29 MB/s on its sample), given buffers it needs no GIL
            import pyarrow as pa

            texts = pa.array(texts, type=pa.large_string())
        arr = self.tok.encode_batch(_awkward(texts), parallel=self.parallel)
        layout = arr.layout
        if isinstance(layout, ak.contents.ListOffsetArray) and isinstance(layout.content, ak.contents.NumpyArray):
            # the array's own buffers, no copy: ids of text i are data[offsets[i]:offsets[i + 1]]
            offsets = np.asarray(layout.offsets.data, dtype=np.int64)
            ids = np.asarray(layout.content.data, dtype=np.uint32)[offsets[0] : offsets[-1]]
            offsets = offsets - offsets[0]
        else:
            ids = np.asarray(ak.to_numpy(ak.flatten(arr, axis=1)), dtype=np.uint32)
            offsets = np.zeros(len(texts) + 1, dtype=np.int64)
            np.cumsum(np.asarray(ak.to_numpy(ak.num(arr, axis=1))), out=offsets[1:])
        if add_special_tokens:
            return wrap((ids, offsets), self.prefix, self.suffix)
        return ids, offsets


def _awkward(texts: Any) -> Any:
    """An awkward array of strings over an Arrow string array's own buffers: no copy of the text and
    no Python `str` (a `str` that is not ASCII is decoded into 2-4 bytes a character to be made,
    and encoded back to UTF-8 inside the engine's call: 0.28 + 0.22 CPU-s of a 565 MB corpus with
    Korean in a third of its documents, `docs/performance.md`). Nulls must be filled before."""
    import awkward as ak
    import pyarrow as pa

    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        texts = texts.cast(pa.large_string())
    wide = pa.types.is_large_string(texts.type)
    bufs = texts.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32)[texts.offset : texts.offset + len(texts) + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    start, end = int(offsets[0]), int(offsets[-1])
    content = ak.contents.NumpyArray(data[start:end], parameters={"__array__": "char"})
    layout = ak.contents.ListOffsetArray(
        ak.index.Index64(offsets.astype(np.int64) - start), content, parameters={"__array__": "string"}
    )
    return ak.Array(layout)


@dataclass(frozen=True)
class Engine:
    name: str
    build: Any  # (EncoderSetup) -> Encoder
    install: str  # how to get it where it is missing


# The order `auto` tries them: fastest first, as measured (module docstring); `tokenizers` is the
# reference library itself and stays last.
ENGINES: tuple[Engine, ...] = (
    Engine("fastokens", FastokensEncoder, "pip install 'fastokens==0.3.5'"),
    Engine("gigatoken", GigatokenEncoder, "pip install 'gigatoken==0.10.0'"),
    Engine("tiktoken", TiktokenEngine, "pip install tiktoken"),
    Engine("tokenizers", TokenizersEncoder, "pip install tokenizers"),
)
BY_NAME = {e.name: e for e in ENGINES}
FAST = frozenset({"fastokens", "gigatoken"})  # run their own thread pools at hundreds of MB/s a core


# Calls each process has in flight (`parts._pipelined`): while one encodes the tail of its batch (the
# longest documents), the other keeps the cores busy.
CALLS_IN_FLIGHT = 2


def size_fastokens_pool(threads: int) -> None:
    """Size fastokens' thread pool for a process given `threads` cores; read from
    FASTOKENS_BPE_THREADS when the process first encodes (later changes are ignored), and left
    alone when the user set it. Up to CALLS_IN_FLIGHT cores, each call runs on its own thread:
    on 2 cores, a pool of two under two calls in flight spent 2.9-3.2 CPU-s on the 601 MB corpus'
    parts, single-threaded calls 2.4-2.6 (the stage 1.43-1.48 s against 1.75-1.85 s); more cores
    keep fastokens' own pool of all of them (as measured on 16 cores)."""
    import os

    if threads <= CALLS_IN_FLIGHT:
        os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")


def build(setup: EncoderSetup) -> Encoder:
    prebuilt = take_prebuilt(setup)
    return prebuilt if prebuilt is not None else BY_NAME[setup.engine].build(setup)


def take_prebuilt(setup: EncoderSetup) -> Encoder | None:
    """The encoder `prebuild` made for this set-up (waiting while a prebuild runs), once; else None."""
    with _prebuilding:
        _prebuilding.wait_for(lambda: _running_builds == 0)
        return _prebuilt.pop(_prebuilt_key(setup), None)


def _prebuilt_key(setup: EncoderSetup) -> tuple[str, str, bool, int | None]:
    """What a prebuilt encoder is kept under: its engine and what its ids depend on (not the threads)."""
    return (setup.engine, setup.backend_json, setup.split_special_tokens, setup.eos_id)


# Encoders built ahead of the check (`prebuild`), by (engine, pipeline, split_special_tokens, EOS id); taken once.
_prebuilt: dict[tuple[str, str, bool, int | None], Encoder] = {}
_prebuilding = threading.Condition()  # notified when a prebuild ends (built or failed)
_running_builds = 0


def prebuild_begins() -> Callable[[], None]:
    """Count a prebuild as running from now until the returned function is called: `take_prebuilt`
    waits for it to end rather than have the stage build the same encoder a second time."""
    global _running_builds
    with _prebuilding:
        _running_builds += 1

    def ended() -> None:
        global _running_builds
        with _prebuilding:
            _running_builds -= 1
            _prebuilding.notify_all()

    return ended


def fastokens_tokenizer(pipeline_json: str) -> Any:
    """fastokens' tokenizer of a tokenizer.json text (no encoding: its pool is sized later)."""
    import fastokens

    tok = fastokens.Tokenizer.from_json_str(pipeline_json)
    heap.trim()  # the build's own memory, freed (~160 MB for a 128k vocabulary)
    return tok


def prebuild(
    backend_json: str,
    split_special_tokens: bool,
    eos_id: int | None,
    threads: int | None = None,
    tok: Any = None,
) -> None:
    """Build fastokens for this pipeline now (in a thread, while other stages run), for `build` to
    take; only fastokens, whose encoder does not depend on the thread count. `threads`: the cores
    the tokenize stage will give it (the plan's); its pool is sized for them and the encoder made
    `ready` (its first encode starts the pool). Without, it encodes nothing. `tok`: fastokens'
    tokenizer of this same pipeline, already built (from a file that holds it, `reference`)."""
    from moai.stages.tokenize.engine import EncoderSetup

    setup = EncoderSetup(backend_json, split_special_tokens, "fastokens", 1, False, eos_id=eos_id)
    encoder = FastokensEncoder(setup, tok)
    if threads is not None:
        size_fastokens_pool(threads)
        encoder.ready()
    _prebuilt[_prebuilt_key(setup)] = encoder


def prebuild_gigatoken(setup: EncoderSetup) -> None:
    """Build gigatoken for this set-up now (`tokenize.engine: gigatoken`), for `build` to take.
    Its pool starts at the stage's first call: a first parallel call made beside a busy Python
    thread took seconds here (docs/FIELD-NOTES.md)."""
    _prebuilt[_prebuilt_key(setup)] = GigatokenEncoder(setup)


def drop_prebuilt() -> None:
    _prebuilt.clear()
    _file_builds.clear()


@dataclass
class FileBuild:
    """fastokens built from a tokenizer.json file while transformers loads the folder
    (`reference._build_ahead`). The preflight's checks take it (`file_counts`) rather than load the
    file with `tokenizers` again: for a 131k vocabulary that load took 0.3-0.4 s and counting 0.1 s
    a MiB, in the run's main thread before convert began, beside transformers' load and this build.
    `specials`: the ids its post-processor adds to one text, as the file has it (the stage's EOS
    step changes that later)."""

    file: str
    done: threading.Event
    tok: Any = None
    specials: int = 0


_file_builds: dict[str, FileBuild] = {}
# Held while a tokenizer's post-processor changes (`FastokensEncoder.ready`) and while the preflight
# encodes with a file build: fastokens refuses a change while another thread is inside an encode.
_changing = threading.Lock()


def file_build_begins(file: Path) -> FileBuild:
    """Register a build of `file` before it starts (`build_file`): from now `file_counts` waits for it."""
    entry = FileBuild(str(file.resolve()), threading.Event())
    _file_builds[entry.file] = entry
    return entry


def build_file(entry: FileBuild, threads: int | None, stop: threading.Event | None = None) -> Any:
    """fastokens' tokenizer of the registered file (its parse releases the GIL), or None where it
    cannot be built, `threads` is unknown or `stop` is set: `file_counts` then answers None and the
    caller loads the file with `tokenizers`. `threads`: the cores the tokenize stage will give
    fastokens; its pool is sized for them first (the preflight's count would start it)."""
    try:
        if threads is None or (stop is not None and stop.is_set()):
            return None
        size_fastokens_pool(threads)
        import fastokens

        tok = fastokens.Tokenizer.from_file(entry.file)
        heap.trim()  # the build's own memory, freed (~160 MB for a 128k vocabulary)
        entry.specials = int(tok.num_special_tokens_to_add(False))
        entry.tok = tok
    except Exception:  # a platform without fastokens, or a pipeline it does not run
        pass
    finally:
        entry.done.set()
    return entry.tok


def file_build(file: Path) -> FileBuild | None:
    """The build of the tokenizer.json `file` begun ahead (`file_build_begins`), once it is done;
    None when none was begun or it failed."""
    entry = _file_builds.get(str(file.resolve()))
    if entry is None:
        return None
    entry.done.wait()
    return entry if entry.tok is not None else None


def file_build_dropped(entry: FileBuild) -> None:
    """Forget a build that is not the pipeline transformers runs: `file_build` answers None from now."""
    entry.tok = None


def file_counts(file: Path, texts: list[str], add_special_tokens: bool) -> np.ndarray | None:
    """Ids per text (without EOS) of the tokenizer.json `file` as fastokens built it ahead
    (`file_build`), or None."""
    entry = file_build(file)
    tok = None if entry is None else entry.tok  # once: `file_build_dropped` may drop it meanwhile
    if entry is None or tok is None:
        return None
    with _changing:
        _, offsets = tok.encode_batch_flat(texts, add_special_tokens=False)
    lengths = np.diff(np.frombuffer(offsets, dtype="<u8")).astype(np.int64)
    return lengths + entry.specials if add_special_tokens else lengths
