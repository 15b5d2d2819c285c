"""Express a Hugging Face byte-level BPE as a `tiktoken` encoding, when that is exact.

tiktoken runs the same byte-level BPE about twice as fast per core as `tokenizers` (1.7x on a
128k vocabulary, see docs and the tokenize benchmark), but it knows less: one split regex, merge
priority = token id, a piece found whole in the vocabulary is taken whole, and no normalizer.
So we only build an encoding when the tokenizer.json fits those rules:

- merges must follow token-id order. Several merges may produce the same token (Llama-3- and
  Tekken-style files list 152k and 140k such duplicates): the first one sets the token's priority and the
  later ones can never apply before it, so they are dropped;
- a Unicode normalizer (NFC, NFKC, NFD, NFKD, or a sequence of them, as Qwen2 uses) is applied
  with `unicodedata` before encoding;
- `split_special_tokens` (transformers' option) makes special tokens plain text, as the backend's
  `encode_special_tokens` does.

The tokenize stage then verifies on a sample of the real corpus that every id matches
transformers before it uses it; anything else falls back to `tokenizers`, with the reason in the
stage report.
"""

from __future__ import annotations

import bisect
import itertools
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

# The GPT-2 split pattern that tokenizers' ByteLevel(use_regex=True) applies.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class NotExpressible(ValueError):
    """The tokenizer uses something tiktoken cannot reproduce; the message says what."""


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable character standing for each byte."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


@dataclass(frozen=True)
class TiktokenSpec:
    """Everything a worker needs to build the encoding, plus the ids the post-processor adds."""

    pat_str: str
    ranks: dict[bytes, int]
    special_tokens: dict[str, int]
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    normalization: tuple[NormalForm, ...] = ()  # unicodedata forms applied in order before encoding
    text_specials: frozenset[str] = frozenset()  # added tokens encoded as plain text (split_special_tokens)


def _split_pattern(pre: dict | None) -> str:
    if pre is None:
        raise NotExpressible("no pre-tokenizer (byte-level BPE expected)")
    if pre["type"] == "ByteLevel":
        if pre.get("add_prefix_space"):
            raise NotExpressible("ByteLevel add_prefix_space=true")
        if not pre.get("use_regex", True):
            raise NotExpressible("ByteLevel without a split regex")
        return GPT2_PATTERN
    if pre["type"] == "Sequence":
        steps = pre["pretokenizers"]
        if (
            len(steps) == 2
            and steps[0]["type"] == "Split"
            and steps[1]["type"] == "ByteLevel"
            and "Regex" in steps[0]["pattern"]
            and steps[0].get("behavior") == "Isolated"
            and not steps[0].get("invert")
            and not steps[1].get("add_prefix_space")
            and not steps[1].get("use_regex", True)
        ):
            return steps[0]["pattern"]["Regex"]
    raise NotExpressible(f"pre-tokenizer {pre['type']} is not Split(regex)+ByteLevel or ByteLevel")


NormalForm = Literal["NFC", "NFD", "NFKC", "NFKD"]
NORMAL_FORMS: tuple[NormalForm, ...] = ("NFC", "NFD", "NFKC", "NFKD")


def _normalization(norm: dict | None) -> tuple[NormalForm, ...]:
    """The unicodedata forms a tokenizers normalizer applies, or `NotExpressible`."""
    if norm is None:
        return ()
    if norm["type"] in NORMAL_FORMS:
        return (norm["type"],)
    if norm["type"] == "Sequence":
        return tuple(f for step in norm["normalizers"] for f in _normalization(step))
    raise NotExpressible(f"normalizer {norm['type']}")


def _merge_priorities_follow_ids(merges: list, vocab: dict[str, int]) -> None:
    """tiktoken merges by token id; HF BPE by merge rank. Equal when the first merge producing each
    token comes in id order; later merges producing an already made token are duplicates."""
    last = -1
    made: set[int] = set()
    for m in merges:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        idx = vocab.get(a + b)
        if idx is None:
            raise NotExpressible(f"merge {a!r} + {b!r} makes a token that is not in the vocabulary")
        if idx in made:
            continue
        if idx <= last:
            raise NotExpressible(f"merge order differs from token id order (merge {a!r} + {b!r})")
        made.add(idx)
        last = idx


def spec_from_tokenizer_json(backend_json: str, split_special_tokens: bool = False) -> TiktokenSpec:
    """Build the tiktoken spec of a tokenizer.json, or raise `NotExpressible` naming the obstacle."""
    from moai.stages.tokenizer import parsed_backend, rust_backend

    data = parsed_backend(backend_json)
    model = data["model"]
    if model.get("type") != "BPE":
        raise NotExpressible(f"model type {model.get('type')} is not BPE")
    if (
        model.get("dropout")
        or model.get("byte_fallback")
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
    ):
        raise NotExpressible("BPE with dropout, byte fallback or sub-word affixes")
    normalization = _normalization(data.get("normalizer"))
    pattern = _split_pattern(data.get("pre_tokenizer"))

    decode = byte_decoder()
    ranks: dict[bytes, int] = {}
    for token, idx in model["vocab"].items():
        try:
            ranks[bytes(decode[c] for c in token)] = idx
        except KeyError:
            raise NotExpressible(f"vocabulary token {token!r} is not byte-level") from None
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise NotExpressible(f"{len(missing)} single bytes have no token (e.g. {missing[0]:#04x})")
    specials = {}
    text_specials = set()
    for added in data.get("added_tokens", []):
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word") or added.get("normalized"):
            raise NotExpressible(f"added token {added['content']!r} has strip/word/normalize options")
        specials[added["content"]] = added["id"]
        if split_special_tokens and added.get("special"):
            text_specials.add(added["content"])
        ranks.pop(added["content"].encode(), None)
    _merge_priorities_follow_ids(model.get("merges", []), model["vocab"])

    tok = rust_backend(backend_json)
    if not model.get("ignore_merges"):
        # tiktoken takes a piece found whole in the vocabulary as one token; without
        # ignore_merges, BPE does so only if merging the token's bytes gives the token back.
        added = {a["content"] for a in data.get("added_tokens", [])}
        for token, idx in model["vocab"].items():
            if len(token) > 1 and token not in added and [t.id for t in tok.model.tokenize(token)] != [idx]:
                raise NotExpressible(f"token {token!r} is not reached by merging its own bytes")
    bare = tok.encode("a", add_special_tokens=False).ids
    full = tok.encode("a", add_special_tokens=True).ids
    at = next((i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), None)
    if at is None:
        raise NotExpressible("the post-processor changes the text's ids")
    return TiktokenSpec(
        pattern,
        ranks,
        specials,
        tuple(full[:at]),
        tuple(full[at + len(bare) :]),
        normalization,
        frozenset(text_specials),
    )


class TiktokenEncoder:
    """`encode_batch(texts, add_special_tokens) -> list of id lists`, the same ids as tokenizers.

    tiktoken's own `encode_batch` starts a thread pool per call and submits one task per text; with
    many small documents that overhead is a good part of the time (measured: ~10% of the CPU
    seconds on 1.6 KB documents). Here a pool made once encodes contiguous runs of texts, each text
    with the very call `Encoding.encode` makes (`_core_bpe.encode`, which releases the GIL)."""

    RUNS_PER_THREAD = 4  # runs of texts per thread and call: balance without many tasks

    def __init__(self, spec: TiktokenSpec, num_threads: int):
        import tiktoken

        self.enc = tiktoken.Encoding(
            "moai", pat_str=spec.pat_str, mergeable_ranks=spec.ranks, special_tokens=spec.special_tokens
        )
        self.prefix = list(spec.prefix)
        self.suffix = list(spec.suffix)
        self.normalization = spec.normalization
        self.allowed = set(spec.special_tokens) - spec.text_specials
        self.num_threads = num_threads
        self._core: Any = getattr(self.enc, "_core_bpe", None)
        self._pool: Any = None  # a ThreadPoolExecutor, made on first use

    def _encode_run(self, texts: list[str], arrays: bool = False) -> list[Any]:
        core, allowed = self._core, self.allowed
        out: list[Any] = []
        to_buffer = getattr(core, "encode_to_tiktoken_buffer", None) if arrays else None
        for t in texts:
            try:
                if to_buffer is not None:
                    out.append(np.frombuffer(to_buffer(t, allowed), dtype=np.uint32))
                else:
                    out.append(core.encode(t, allowed))
            except UnicodeEncodeError:  # lone surrogates: tiktoken's own fix-up, in `encode`
                out.append(self.enc.encode(t, allowed_special=self.allowed, disallowed_special=()))
        return out

    def _encode_all(self, texts: list[str], arrays: bool = False) -> list[Any]:
        if self._core is None:  # a tiktoken without the attribute: its public batch call
            # disallowed_special=(): special-token text that is not allowed is encoded as plain text
            return self.enc.encode_batch(
                texts, num_threads=self.num_threads, allowed_special=self.allowed, disallowed_special=()
            )
        runs = self.num_threads * self.RUNS_PER_THREAD
        if self.num_threads <= 1 or len(texts) < 2 * runs:
            return self._encode_run(texts, arrays)
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="moai-tiktoken")
        cum = list(itertools.accumulate(len(t) for t in texts))
        cuts = sorted({0, len(texts), *(bisect.bisect_left(cum, cum[-1] * i // runs) for i in range(1, runs))})
        futures = [self._pool.submit(self._encode_run, texts[a:b], arrays) for a, b in itertools.pairwise(cuts)]
        return [ids for f in futures for ids in f.result()]

    def _normalized(self, texts: list[str]) -> list[str]:
        """The texts after the tokenizer's Unicode normalizer (`TiktokenSpec.normalization`)."""
        for form in self.normalization:
            texts = [unicodedata.normalize(form, t) for t in texts]
        return texts

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray | list[int]]:
        """`encode_batch(texts, True)` as uint32 arrays, straight from tiktoken's buffer: no Python
        int per token (~20% of the encoding's CPU on 1.6 KB documents); a text with lone
        surrogates comes back as a list."""
        out = self._encode_all(self._normalized(texts), arrays=True)
        if self.prefix or self.suffix:
            pre, suf = np.asarray(self.prefix, dtype=np.uint32), np.asarray(self.suffix, dtype=np.uint32)
            out = [np.concatenate([pre, np.asarray(ids, dtype=np.uint32), suf]) for ids in out]
        return out

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        # special-token text that is not allowed is encoded as plain text (allowed_special only)
        out = self._encode_all(self._normalized(texts))
        if add_special_tokens and (self.prefix or self.suffix):
            out = [self.prefix + ids + self.suffix for ids in out]
        return out
