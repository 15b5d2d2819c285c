"""The word n-gram shingles that near-duplicate detection (MinHash) compares, as datatrove defines them.

A document's shingles are those of datatrove's `MinhashDedupSignature` (0.10, 64-bit xxhash), so
that moai's signatures equal datatrove's for the same seed, and both tools find the same pairs:

1. the text is simplified as datatrove's `simplify_text` does: lower case; every run of digits (any
   script, with one decimal separator) becomes `0`; datatrove's punctuation characters (ASCII and
   CJK punctuation, control characters) become spaces; Unicode NFD, with combining marks
   (category Mn) removed, so `café` → `cafe` (Hangul syllables decompose into jamo, which are kept);
2. words are the whitespace-separated pieces: a Korean eojeol is one word;
3. a shingle is `n` consecutive words joined by one space, hashed with XXH64 (seed 0) of its
   UTF-8 bytes. A document of fewer than `n` words (but at least one) has one shingle of all its
   words, which datatrove leaves without a signature.

Everything is Arrow kernels and NumPy over a batch (`moai.clean.xxh64` hashes the shingles in a
few dozen vector passes). Differences from datatrove come only from Arrow's and Python's Unicode
tables for case (Python lower-cases a final `Σ` to `ς`, Arrow to `σ`; `İ` to `i̇` against `i`).

Decontamination uses its own n-grams (`moai.clean.ngrams`), where numbers are kept.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moai.clean.ngrams import Ngrams, string_array
from moai.clean.xxh64 import xxh64_spans

# datatrove.utils.text.PUNCTUATION (0.10): these become spaces.
_PUNCTUATION = "!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»" + "".join(
    map(chr, (x for a, b in ((0, 9), (11, 13), (13, 32), (127, 160)) for x in range(a, b)))
)
_PUNCT_RUN = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in _PUNCTUATION) + "]+"
_NUMBER = r"\p{Nd}+([.,،٫⎖⎗⎘]\p{Nd}+)?"
# What Python's str.split() splits on and is not punctuation above (RE2's \s is ASCII only).
_WS = "\\t\\n\\r\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
_WS_RUN = f"[ {_WS}]{{2,}}|[{_WS}]"


def simplified(texts: pa.Array | pa.ChunkedArray | list[str]) -> pa.Array:
    """Each text simplified (step 1), with its words separated by exactly one space."""
    arr = string_array(texts)
    arr = pc.utf8_lower(arr.fill_null(""))
    arr = pc.replace_substring_regex(arr, _NUMBER, "0")
    arr = pc.replace_substring_regex(arr, _PUNCT_RUN, " ")
    wide = pc.invert(pc.string_is_ascii(arr))
    if pc.any(wide).as_py():  # NFD and mark removal change only non-ASCII text
        sub = pc.replace_substring_regex(pc.utf8_normalize(arr.filter(wide), "NFD"), r"\p{Mn}+", "")
        arr = pc.replace_with_mask(arr, wide, sub)
    return pc.utf8_trim(pc.replace_substring_regex(arr, _WS_RUN, " "), " ")


def shingles(texts: pa.Array | pa.ChunkedArray | list[str], n: int) -> Ngrams:
    """The shingle hashes of every document (see the module docstring), in order, per document."""
    if n < 1:
        raise ValueError(f"n-gram size {n} must be at least 1")
    arr = simplified(texts)
    docs = len(arr)
    _, off_buf, data = arr.buffers()
    wide_offsets = pa.types.is_large_string(arr.type)
    offsets = np.frombuffer(off_buf, dtype=np.int64 if wide_offsets else np.int32)[arr.offset : arr.offset + docs + 1]
    offsets = offsets.astype(np.int64)
    buf = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    doc_start, doc_end = offsets[:-1], offsets[1:]
    nonempty = doc_end > doc_start
    spaces = np.flatnonzero(buf[lo:hi] == 0x20) + lo
    # words: each non-empty document starts one, each space starts the next; ends likewise
    starts = np.sort(np.concatenate([doc_start[nonempty], spaces + 1]))
    ends = np.sort(np.concatenate([doc_end[nonempty], spaces]))
    word_doc = np.searchsorted(doc_end, starts, side="right")
    counts = np.bincount(word_doc, minlength=docs)
    first = np.zeros(docs + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    pos = np.arange(len(starts), dtype=np.int64)
    full = pos + n <= first[1:][word_doc]  # windows of n words inside one document
    span_start = starts[full]
    span_end = ends[pos[full] + n - 1]
    span_doc = word_doc[full]
    few = np.flatnonzero((counts > 0) & (counts < n))  # fewer than n words: one shingle of all
    if len(few):
        span_start = np.concatenate([span_start, doc_start[few]])
        span_end = np.concatenate([span_end, doc_end[few]])
        span_doc = np.concatenate([span_doc, few])
        order = np.argsort(span_doc, kind="stable")
        span_start, span_end, span_doc = span_start[order], span_end[order], span_doc[order]
    hashes = xxh64_spans(memoryview(data) if data is not None else b"", span_start, span_end)
    out = np.zeros(docs + 1, dtype=np.int64)
    np.cumsum(np.bincount(span_doc, minlength=docs), out=out[1:])
    return Ngrams(hashes, out)


def shingle_set(text: str, n: int) -> set[int]:
    """The shingle hash set of one text."""
    return set(shingles([text], n).hashes.tolist())
