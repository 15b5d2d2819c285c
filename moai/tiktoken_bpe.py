"""Express a Hugging Face byte-level BPE as a `tiktoken` encoding, when that is exact.

tiktoken runs the same byte-level BPE about twice as fast per core as `tokenizers` (measured
here, see ../shared/FIELD-NOTES.md), but it knows less: no normalizer, one split regex, merge
priority = token id, and a piece found whole in the vocabulary is taken whole. So we only build
an encoding when the tokenizer.json fits those rules, and the tokenize stage then verifies on a
sample of the real corpus that every id matches before it uses it (`verify`); anything else
falls back to `tokenizers` with the reason in the stage report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

# The GPT-2 split pattern that tokenizers' ByteLevel(use_regex=True) applies.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class NotExpressible(ValueError):
    """The tokenizer uses something tiktoken cannot reproduce; the message says what."""


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable character standing for each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


@dataclass(frozen=True)
class TiktokenSpec:
    """Everything a worker needs to build the encoding, plus the ids the post-processor adds."""

    pat_str: str
    ranks: dict[bytes, int]
    special_tokens: dict[str, int]
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]


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
        if (len(steps) == 2 and steps[0]["type"] == "Split" and steps[1]["type"] == "ByteLevel"
                and "Regex" in steps[0]["pattern"] and steps[0].get("behavior") == "Isolated"
                and not steps[0].get("invert") and not steps[1].get("add_prefix_space")
                and not steps[1].get("use_regex", True)):
            return steps[0]["pattern"]["Regex"]
    raise NotExpressible(f"pre-tokenizer {pre['type']} is not Split(regex)+ByteLevel or ByteLevel")


def spec_from_tokenizer_json(backend_json: str) -> TiktokenSpec:
    """Build the tiktoken spec of a tokenizer.json, or raise `NotExpressible` naming the obstacle."""
    from tokenizers import Tokenizer

    data = json.loads(backend_json)
    model = data["model"]
    if model.get("type") != "BPE":
        raise NotExpressible(f"model type {model.get('type')} is not BPE")
    if model.get("dropout") or model.get("byte_fallback") or model.get("continuing_subword_prefix") \
            or model.get("end_of_word_suffix"):
        raise NotExpressible("BPE with dropout, byte fallback or sub-word affixes")
    if data.get("normalizer") is not None:
        raise NotExpressible(f"normalizer {data['normalizer'].get('type')}")
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
    for added in data.get("added_tokens", []):
        if added.get("lstrip") or added.get("rstrip") or added.get("single_word") or added.get("normalized"):
            raise NotExpressible(f"added token {added['content']!r} has strip/word/normalize options")
        specials[added["content"]] = added["id"]
        ranks.pop(added["content"].encode(), None)

    # Merge priority is the merged token's id in tiktoken; it must follow the merge list's order.
    merges = model.get("merges", [])
    last = -1
    for m in merges:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        idx = model["vocab"].get(a + b)
        if idx is None or idx <= last:
            raise NotExpressible("merge order differs from token id order")
        last = idx

    tok = Tokenizer.from_str(backend_json)
    if not model.get("ignore_merges"):
        # tiktoken takes a piece found whole in the vocabulary as one token; without
        # ignore_merges, BPE does so only if merging the token's bytes gives the token back.
        added = {a["content"] for a in data.get("added_tokens", [])}
        for token, idx in model["vocab"].items():
            if len(token) > 1 and token not in added and [t.id for t in tok.model.tokenize(token)] != [idx]:
                raise NotExpressible(f"token {token!r} is not reached by merging its own bytes")
    bare = tok.encode("a", add_special_tokens=False).ids
    full = tok.encode("a", add_special_tokens=True).ids
    at = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare), None)
    if at is None:
        raise NotExpressible("the post-processor changes the text's ids")
    return TiktokenSpec(pattern, ranks, specials, tuple(full[:at]), tuple(full[at + len(bare):]))


class TiktokenEncoder:
    """`encode_batch(texts) -> list of id lists`, the same as tokenizers with special tokens added."""

    def __init__(self, spec: TiktokenSpec, num_threads: int):
        import tiktoken

        self.enc = tiktoken.Encoding("moai", pat_str=spec.pat_str, mergeable_ranks=spec.ranks,
                                     special_tokens=spec.special_tokens)
        self.prefix = list(spec.prefix)
        self.suffix = list(spec.suffix)
        self.num_threads = num_threads

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        out = self.enc.encode_batch(texts, num_threads=self.num_threads, allowed_special="all")
        if self.prefix or self.suffix:
            out = [self.prefix + ids + self.suffix for ids in out]
        return out


def first_mismatch(encoder: TiktokenEncoder, backend_json: str, texts: list[str]) -> int | None:
    """Index of the first text whose ids differ between tiktoken and tokenizers, or None."""
    from tokenizers import Tokenizer

    reference = Tokenizer.from_str(backend_json).encode_batch_fast(texts, add_special_tokens=True)
    for i, (a, b) in enumerate(zip(encoder.encode_batch(texts), reference)):
        if a != b.ids:
            return i
    return None
