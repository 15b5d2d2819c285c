"""Word n-gram hashes of a batch of documents, computed with Arrow kernels and NumPy.

Near-duplicate detection (MinHash) and decontamination compare documents by their sets of word
n-grams. Both use this one definition of a word n-gram:

1. the text is normalised: Unicode NFKC, lower case;
2. every run of characters that are neither letters, digits nor whitespace becomes a space
   (so `don't` → `don t`, `x=1;` → `x 1`);
3. words are the whitespace-separated pieces: a Korean eojeol (`학교에서`) is one word;
4. an n-gram is `n` consecutive words of one document; a document with fewer than `n` words
   (but at least one) has a single n-gram of all its words.

Steps 1–3 are Arrow compute kernels over the whole batch (no Python per character). Each
distinct word of the batch is hashed once (xxh3, 64 bits); an n-gram's hash combines its word
hashes as Σ wordhash[i+k] · C[k] mod 2^64 with fixed odd constants, computed with `n` vector
passes over all the batch's words. Hashes do not depend on the batch a document is in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

# Fixed odd 64-bit constants, one per position in an n-gram (from a seeded generator, never changed:
# stored signatures and evaluation indexes depend on them).
_MAX_N = 64
_C = np.random.default_rng(0x6D6F6169).integers(1, 2**63, size=_MAX_N, dtype=np.int64).astype(np.uint64) * np.uint64(
    2
) + np.uint64(1)

_NOT_WORD = r"[^\p{L}\p{N}\p{M}\s]+"


@dataclass
class Ngrams:
    """The n-gram hashes of a batch: `hashes[offsets[d]:offsets[d + 1]]` are document d's."""

    hashes: np.ndarray  # uint64
    offsets: np.ndarray  # int64, len = documents + 1

    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)


def string_array(texts: pa.Array | pa.ChunkedArray | list[str]) -> pa.Array:
    """The texts as one Arrow array (a list of str, or chunks combined)."""
    arr = texts if isinstance(texts, pa.Array | pa.ChunkedArray) else pa.array(texts, type=pa.string())
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def normalised_words(texts: pa.Array | pa.ChunkedArray | list[str]) -> pa.ListArray:
    """Each document's words (steps 1–3 above), as one Arrow list array."""
    arr = string_array(texts)
    arr = pc.utf8_lower(pc.utf8_normalize(arr.fill_null(""), "NFKC"))
    arr = pc.utf8_trim_whitespace(pc.replace_substring_regex(arr, _NOT_WORD, " "))
    return pc.utf8_split_whitespace(arr)


def word_hashes(words: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every word, in order, uint64; offsets of each document's words, int64)."""
    flat = words.flatten()
    offsets = words.offsets.to_numpy().astype(np.int64)
    offsets = offsets - offsets[0]
    empty = pc.equal(pc.binary_length(flat), 0).to_numpy(zero_copy_only=False)
    if empty.any():  # an empty document splits into one empty piece: no word
        doc = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        flat = flat.filter(pa.array(~empty))
        offsets = np.zeros(len(offsets), dtype=np.int64)
        np.cumsum(np.bincount(doc[~empty], minlength=len(offsets) - 1), out=offsets[1:])
    if len(flat) == 0:
        return np.zeros(0, dtype=np.uint64), offsets
    encoded = pc.dictionary_encode(flat)
    uniq = encoded.dictionary.cast(pa.binary()).to_pylist()
    table = np.fromiter(map(xxhash.xxh3_64_intdigest, uniq), dtype=np.uint64, count=len(uniq))
    return table[encoded.indices.to_numpy()], offsets


def ngram_hashes(words: np.ndarray, offsets: np.ndarray, n: int, *, short: bool = True) -> Ngrams:
    """Hashes of every n-gram of each document (see the module docstring). With `short`, a document
    of fewer than n words (at least one) has one n-gram of all its words; without, it has none."""
    if not 1 <= n <= _MAX_N:
        raise ValueError(f"n-gram size {n} must be in [1, {_MAX_N}]")
    m = len(words)
    counts = np.diff(offsets)
    if m == 0:
        return Ngrams(np.zeros(0, dtype=np.uint64), np.zeros(len(counts) + 1, dtype=np.int64))
    doc = np.repeat(np.arange(len(counts)), counts)
    end = offsets[1:][doc]  # end of each word's document
    pos = np.arange(m, dtype=np.int64)
    h = np.zeros(m, dtype=np.uint64)
    tmp = np.empty(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        # Sums across document ends too: only the windows inside a document are kept below.
        for k in range(min(n, m)):
            np.multiply(words[k:], _C[k], out=tmp[: m - k])
            h[: m - k] += tmp[: m - k]
    full = pos + n <= end
    if short:
        few = np.flatnonzero((counts > 0) & (counts < n))  # documents of fewer than n words: all of them
        if len(few):
            starts, sizes = offsets[:-1][few], counts[few]
            whole = np.zeros(len(few), dtype=np.uint64)
            with np.errstate(over="ignore"):
                for k in range(int(sizes.max())):
                    inside = k < sizes
                    whole[inside] += words[starts[inside] + k] * _C[k]
            h[starts] = whole
            full[starts] = True
    per_doc = np.bincount(doc[full], minlength=len(counts)) if full.any() else np.zeros(len(counts), dtype=np.int64)
    out_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(per_doc, out=out_offsets[1:])
    return Ngrams(h[full], out_offsets)


def text_ngrams(texts: pa.Array | pa.ChunkedArray | list[str], n: int, *, short: bool = True) -> Ngrams:
    """`ngram_hashes` of raw texts."""
    w, offsets = word_hashes(normalised_words(texts))
    return ngram_hashes(w, offsets, n, short=short)


def ngram_set(text: str, n: int) -> set[int]:
    """The n-gram hash set of one text (for checking a candidate pair exactly)."""
    return set(text_ngrams([text], n).hashes.tolist())
