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

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

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
        """All texts' ids as one array (the parts use this)."""
        ...


class _FromLists:
    """`encode_flat` from `encode` (engines that hand out lists)."""

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        raise NotImplementedError

    def encode_flat(self, texts: list[str], add_special_tokens: bool = True) -> Flat:
        return flat_of(self.encode(texts, add_special_tokens))


class _FromFlat:
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
    little-endian uint32 buffer and uint64 offsets (no Python object per token)."""

    name = "fastokens"

    def __init__(self, setup: EncoderSetup):
        import fastokens

        self.tok = fastokens.Tokenizer.from_json_str(setup.backend_json)
        self.tok.no_truncation()
        self.tok.no_padding()
        self.split = setup.split_special_tokens

    def encode_flat(self, texts: list[str], add_special_tokens: bool = True) -> Flat:
        ids, offsets = self.tok.encode_batch_flat(
            texts, add_special_tokens=add_special_tokens, split_special_tokens=self.split
        )
        return np.frombuffer(ids, dtype="<u4"), np.frombuffer(offsets, dtype="<u8").astype(np.int64)


class GigatokenEncoder(_FromFlat):
    """gigatoken: its native batch call (an awkward array of uint32 ids), with the post-processor's
    ids (BOS, EOS) put around each text here: the native call does not add them."""

    name = "gigatoken"

    def __init__(self, setup: EncoderSetup):
        if setup.split_special_tokens:
            raise NotExpressible("split_special_tokens (gigatoken has no switch for it)")
        import gigatoken

        self.tok = gigatoken.Tokenizer.from_json(setup.backend_json)
        self.parallel = setup.threads > 1
        self.prefix, self.suffix = setup.affixes

    def encode_flat(self, texts: list[str], add_special_tokens: bool = True) -> Flat:
        import awkward as ak

        arr = self.tok.encode_batch(texts, parallel=self.parallel)
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


def build(setup: EncoderSetup) -> Encoder:
    prebuilt = take_prebuilt(setup)
    return prebuilt if prebuilt is not None else BY_NAME[setup.engine].build(setup)


def take_prebuilt(setup: EncoderSetup) -> Encoder | None:
    """The encoder `prebuild` made for this set-up (waiting for it if it is being made), once; else None."""
    key = (setup.engine, setup.backend_json, setup.split_special_tokens)
    building = _building.get(key)
    if building is not None:  # being built ahead: wait for it rather than build it twice
        building.wait()
    return _prebuilt.pop(key, None)


# Encoders built ahead of the check (`prebuild`), by (engine, pipeline, split_special_tokens); taken once.
_prebuilt: dict[tuple[str, str, bool], Encoder] = {}
_building: dict[tuple[str, str, bool], threading.Event] = {}  # set when that build ended (built or failed)


def prebuild(backend_json: str, split_special_tokens: bool) -> None:
    """Build fastokens for this pipeline now (in a thread, while other stages run), for `build` to
    take; only fastokens, whose encoder does not depend on the thread count."""
    from moai.stages.tokenize.engine import EncoderSetup

    key = ("fastokens", backend_json, split_special_tokens)
    done = _building.setdefault(key, threading.Event())
    try:
        setup = EncoderSetup(backend_json, split_special_tokens, "fastokens", 1, False)
        _prebuilt[key] = FastokensEncoder(setup)
    finally:
        done.set()
        _building.pop(key, None)


def drop_prebuilt() -> None:
    _prebuilt.clear()
