"""Exact and near-duplicate detection: normalised-text hashes, MinHash + LSH, and clustering.

Exact: a document's key is the 128-bit xxh3 of its text after Unicode NFKC and with every run of
whitespace collapsed to one space (trimmed); documents with the same key are copies.

Near: datatrove's MinHash. Each document's word 5-gram shingles (`moai.clean.shingles`, hashed
as datatrove hashes them) go through `num_perm` hash functions ((a_p · x + b_p) mod 2^64) mod
(2^61 − 1) drawn as datatrove draws them; the minimum of each over the document's shingles is its
signature, in which two documents agree at each position with probability equal to the Jaccard
similarity of their shingle sets. For the same seed the signatures equal datatrove's, so the two
tools make the same candidate pairs (not only pairs equally likely: MinHash near the threshold is
a coin toss, and the same MinHash with another seed disagrees on ~13% of a realistic removed set,
as did moai's earlier hash family). LSH cuts the signature into `bands` × `rows`; documents whose
values agree on a whole band become candidates. With `verify`, a candidate pair is kept only when
the exact Jaccard of the two shingle sets reaches the threshold (LSH then only has to find the
pairs, so the bands are chosen for recall). Candidate pairs join clusters (union-find,
transitive); in a cluster the document that comes first (the earlier source in config order,
then the earlier row) is kept and the others are dropped.

Everything here is vectorised over a batch: the signature of a batch is NumPy passes over its
shingles, in document-aligned blocks that stay in the CPU cache whatever the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from moai.clean.ngrams import Ngrams, string_array
from moai.clean.shingles import shingles

EMPTY = np.uint64(2**64 - 1)  # the band hash of a document without any word (never a candidate)


def exact_keys(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """(n, 2) uint64: the 128-bit key of each normalised text (see the module docstring)."""
    arr = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    arr = pc.utf8_normalize(arr.fill_null(""), "NFKC")
    # = every run of whitespace to one space: a lone space is left alone, which is most of them (5x faster)
    arr = pc.utf8_trim_whitespace(pc.replace_substring_regex(arr, r"\s{2,}|[^\S ]", " "))
    out = np.empty((len(arr), 2), dtype=np.uint64)
    for i, b in enumerate(arr.cast(pa.binary()).to_pylist()):
        d = xxhash.xxh3_128_intdigest(b)
        out[i, 0], out[i, 1] = d >> 64, d & 0xFFFFFFFFFFFFFFFF
    return out


def _false_rates(threshold: float, bands: int, rows: int) -> tuple[float, float]:
    """(probability mass of pairs below the threshold that become candidates, of pairs above that
    do not), integrated over similarity (as datasketch and the MinHash literature choose b × r)."""
    lo = np.linspace(0, threshold, 200)
    hi = np.linspace(threshold, 1, 200)
    fp = np.trapezoid(1 - (1 - lo**rows) ** bands, lo)
    fn = np.trapezoid((1 - hi**rows) ** bands, hi)
    return float(fp), float(fn)


def derive_bands(threshold: float, num_perm: int, *, verify: bool) -> tuple[int, int]:
    """The bands × rows (≤ num_perm) minimising (1 − w) · false positives + w · false negatives.
    With verification, candidates are checked exactly, so a false candidate costs only time and a
    missed pair keeps a duplicate: w = 0.97 (112 permutations at 0.8: 16 × 7, a pair at 0.8 is a
    candidate with probability 0.98, at 0.85 0.998). Without, w = 0.9 (12 × 9: 0.82 at 0.8, 0.39
    at 0.7). Equal weights would put the curve's midpoint at the threshold (0.47 at 0.8)."""
    w = 0.97 if verify else 0.9
    best, best_cost = (1, num_perm), math.inf
    for rows in range(1, num_perm + 1):
        for bands in range(1, num_perm // rows + 1):
            fp, fn = _false_rates(threshold, bands, rows)
            cost = (1 - w) * fp + w * fn
            if cost < best_cost - 1e-12:
                best, best_cost = (bands, rows), cost
    return best


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """The probability that a pair of this Jaccard similarity becomes a candidate."""
    return 1 - (1 - similarity**rows) ** bands


_MERSENNE = np.uint64((1 << 61) - 1)


@dataclass(frozen=True)
class MinHasher:
    """datatrove's MinHash (0.10, 64-bit): a document's shingles (`moai.clean.shingles`) are hashed
    by `num_perm` functions h_p(x) = ((a_p · x + b_p) mod 2^64) mod (2^61 − 1), with a_p, b_p
    drawn by `numpy.random.RandomState(seed)` as datatrove draws them; the minimum of each is the
    signature. For the same seed the signatures equal datatrove's, value for value."""

    ngram: int
    num_perm: int
    bands: int
    rows: int
    seed: int = 1

    def _params(self) -> tuple[np.ndarray, np.ndarray]:
        gen = np.random.RandomState(self.seed)
        a = gen.randint(1, _MERSENNE, dtype=np.uint64, size=self.num_perm)
        b = gen.randint(0, _MERSENNE, dtype=np.uint64, size=self.num_perm)
        return a, b

    def signatures(self, texts: pa.Array | pa.ChunkedArray | list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(signatures (n, num_perm) uint64, has_shingles (n,) bool)."""
        arr = string_array(texts)
        n = len(arr)
        sig = np.full((n, self.num_perm), np.iinfo(np.uint64).max, dtype=np.uint64)
        has = np.zeros(n, dtype=bool)
        a, b = self._params()
        # Small batches and blocks: every array stays in the CPU's cache and its memory is reused
        # (fresh memory costs page faults that, on a VM, took longer than the arithmetic).
        for lo in range(0, n, _DOCS_PER_BATCH):
            ng = shingles(arr.slice(lo, _DOCS_PER_BATCH), self.ngram)
            counts = ng.counts()
            has[lo : lo + len(counts)] = counts > 0
            _min_hashes(ng, a, b, sig[lo : lo + len(counts)])
        return sig, has

    def band_hashes(self, sig: np.ndarray, has: np.ndarray) -> np.ndarray:
        """(n, bands) uint64: each band's rows combined into one hash; EMPTY for a document without words."""
        n = len(sig)
        out = np.zeros((n, self.bands), dtype=np.uint64)
        mult = _band_constants(self.rows)
        with np.errstate(over="ignore"):
            for j in range(self.bands):
                part = sig[:, j * self.rows : (j + 1) * self.rows].astype(np.uint64)
                h = (part * mult[None, :]).sum(axis=1, dtype=np.uint64)
                out[:, j] = (h ^ (h >> np.uint64(29))) * np.uint64(0xBF58476D1CE4E5B9)
        out[~has] = EMPTY
        return out

    def __call__(self, texts: pa.Array | pa.ChunkedArray | list[str]) -> np.ndarray:
        sig, has = self.signatures(texts)
        return self.band_hashes(sig, has)


_DOCS_PER_BATCH = 500
_BLOCK = 65_536  # shingles per pass (× _PERMS_PER_PASS × 8 bytes: 1 MB, the L2 cache)
_PERMS_PER_PASS = 2


def _min_hashes(ng: Ngrams, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out[d] = the minimum over document d's shingles x of ((a·x + b) mod 2^64) mod (2^61 − 1),
    for documents with shingles; computed in document-aligned blocks of about `_BLOCK` shingles."""
    counts = ng.counts()
    docs = np.flatnonzero(counts > 0)
    if not len(docs):
        return
    x_all, off = ng.hashes, ng.offsets
    # cut the documents into runs of about _BLOCK shingles (a longer document is a run alone)
    cuts = np.unique(np.searchsorted(off[docs], np.arange(0, int(off[-1]), _BLOCK), side="right") - 1)
    k = len(a)
    width = _BLOCK
    v = np.empty((_PERMS_PER_PASS, width), dtype=np.uint64)
    w = np.empty_like(v)
    with np.errstate(over="ignore"):
        for c, first in enumerate(cuts):
            run = docs[first : cuts[c + 1] if c + 1 < len(cuts) else len(docs)]
            s0, s1 = int(off[run[0]]), int(off[run[-1] + 1])
            x = x_all[s0:s1]
            m = s1 - s0
            if m > width:
                width = m
                v = np.empty((_PERMS_PER_PASS, width), dtype=np.uint64)
                w = np.empty_like(v)
            # documents without shingles have no slot in x: the reduction runs from each
            # document's own start (strictly increasing) to the next one's
            starts = off[run] - s0
            for p in range(0, k, _PERMS_PER_PASS):
                q = min(k, p + _PERMS_PER_PASS)
                vv, ww = v[: q - p, :m], w[: q - p, :m]
                np.multiply(a[p:q, None], x[None, :], out=vv)
                vv += b[p:q, None]
                np.right_shift(vv, np.uint64(61), out=ww)  # mod 2^61 − 1: hi · 2^61 + lo ≡ hi + lo
                vv &= _MERSENNE
                vv += ww
                if vv.max() >= _MERSENNE:  # hi + lo ≥ p: about once in 2^58 values, so checked, not done
                    np.subtract(vv, _MERSENNE, out=ww)  # below p this wraps high
                    np.minimum(vv, ww, out=vv)
                out[run, p:q] = np.minimum.reduceat(vv, starts, axis=1).T


def _band_constants(rows: int) -> np.ndarray:
    rng = np.random.default_rng(0xBA4D)
    return rng.integers(0, 2**63, size=rows, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)


def first_copies(keys: np.ndarray) -> np.ndarray:
    """For each row of (n, 2) `keys`, the index of the first row with the same key."""
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64)
    flat = np.ascontiguousarray(keys).view(np.dtype((np.void, 16))).ravel()
    _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    return first[inverse.ravel()].astype(np.int64)


class UnionFind:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while x != root:
            parent[x], x = root, parent.get(x, x)
        return root

    def union(self, x: int, y: int) -> None:
        rx, ry = self.find(x), self.find(y)
        if rx != ry:  # the smaller id is the root: a cluster's root is its first document
            if rx < ry:
                self.parent[ry] = rx
            else:
                self.parent[rx] = ry


def candidate_groups(bands: np.ndarray, alive: np.ndarray) -> list[np.ndarray]:
    """Groups of ≥ 2 document ids (ascending) that share a band hash, band by band."""
    ids = np.flatnonzero(alive)
    groups: list[np.ndarray] = []
    for j in range(bands.shape[1]):
        col = bands[ids, j]
        keep = col != EMPTY
        col, members = col[keep], ids[keep]
        order = np.argsort(col, kind="stable")
        col, members = col[order], members[order]
        if len(col) < 2:
            continue
        edge = np.flatnonzero(col[1:] != col[:-1]) + 1
        bounds = np.concatenate([[0], edge, [len(col)]])
        sizes = np.diff(bounds)
        for s in np.flatnonzero(sizes > 1):
            groups.append(members[bounds[s] : bounds[s + 1]])
    return groups


def cluster(
    bands: np.ndarray,
    alive: np.ndarray,
    *,
    verify: Callable[[int, int], bool] | None = None,
    prefetch: Callable[[list[int]], None] | None = None,
    max_tries: int = 8,
    chunk: int = 5_000,
) -> tuple[np.ndarray, dict[str, int]]:
    """The root (first document) of each document's cluster (−1 for one alone), and counts.

    Without `verify` every member of a band group joins the group's first document. With it, a
    member joins the first of up to `max_tries` earlier members of its group that it verifies
    against (so one dissimilar first member does not hide a pair). `prefetch(ids)` is called
    with the members of the next groups (about `chunk` documents) before they are verified, so
    their n-grams can be computed in one batch."""
    uf = UnionFind()
    pairs = checked = 0
    seen: set[tuple[int, int]] = set()
    groups = candidate_groups(bands, alive)
    fetched_to = 0
    for g, group in enumerate(groups):
        if verify is not None and prefetch is not None and g >= fetched_to:
            ids: set[int] = set()
            while fetched_to < len(groups) and len(ids) < chunk:
                ids.update(groups[fetched_to].tolist())
                fetched_to += 1
            prefetch(sorted(ids))
        members = group.tolist()
        for i in range(1, len(members)):
            y = members[i]
            for x in members[: min(i, max_tries)]:
                if uf.find(x) == uf.find(y):
                    break
                pair = (x, y)
                if verify is None:
                    uf.union(x, y)
                    pairs += 1
                    break
                if pair in seen:
                    continue
                seen.add(pair)
                checked += 1
                if verify(x, y):
                    uf.union(x, y)
                    pairs += 1
                    break
    root = np.full(len(bands), -1, dtype=np.int64)
    for x in list(uf.parent):
        root[x] = uf.find(x)
    for r in set(root[root >= 0].tolist()):
        root[r] = r
    return root, {"pairs_joined": pairs, "pairs_checked": checked}


def jaccard(a: set[int], b: set[int]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def jaccard_sorted(a: np.ndarray, b: np.ndarray) -> float:
    """The Jaccard similarity of two sorted arrays of distinct hashes."""
    if not len(a) and not len(b):
        return 1.0
    both = len(np.intersect1d(a, b, assume_unique=True))
    return both / (len(a) + len(b) - both)
