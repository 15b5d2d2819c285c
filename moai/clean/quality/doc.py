"""A document's statistics shared by the rules (lines, paragraphs, words, n-gram hashes), computed
once on first use, and the patterns the rules read them with."""

from __future__ import annotations

import re
from collections import Counter
from functools import cached_property

import numpy as np

from moai.clean.words import TextStats

# A line ends a sentence: terminal punctuation of Latin, CJK (。！？), Arabic, Devanagari, Ethiopic,
# Myanmar and Khmer scripts, then any closing quotes or brackets. Korean sentences end in '.'.
_TERMINAL = ".!?。！？｡．؟۔।॥።။។៕‼⁇⁈⁉"
_CLOSERS = "\"'”’」』)]）"
_TERMINAL_SET = frozenset(_TERMINAL)
_ELLIPSES = ("...", "…", "⋯", "···")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")


class _Doc(TextStats):
    """A document's statistics for the rules (lines, paragraphs, n-grams), computed on first use."""

    def __init__(self, text: str):
        super().__init__(text)
        self._ngram_hashes: list[np.ndarray] = []  # [n - 1]: a hash of the n words at each position
        self._dup_fractions: dict[int, float] = {}

    @cached_property
    def paragraphs(self) -> list[str]:
        return [p for p in (s.strip() for s in _PARAGRAPH_BREAK.split(self.text)) if p]

    @cached_property
    def line_cores(self) -> list[str]:
        """Each line without its closing quotes and brackets, whose last character ends a sentence."""
        return [line.rstrip(_CLOSERS) for line in self.lines]

    @cached_property
    def line_chars(self) -> int:
        return sum(map(len, self.lines))

    @cached_property
    def line_counts(self) -> Counter[str]:
        return Counter(self.lines)

    @cached_property
    def word_ends(self) -> np.ndarray:
        """Characters in words 0..i-1 at [i] (so the characters of words i..j-1 are [j] - [i])."""
        ends = np.zeros(self.num_words + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, self.words), dtype=np.int64, count=self.num_words), out=ends[1:])
        return ends

    def ngram_hashes(self, n: int) -> np.ndarray:
        """A 64-bit hash of the n words starting at each position (Python's str hash, combined
        polynomially; a collision in one document is ~2^-64 per pair)."""
        h = self._ngram_hashes
        if not h:
            h.append(np.fromiter(map(hash, self.words), dtype=np.int64, count=self.num_words).view(np.uint64))
        with np.errstate(over="ignore"):
            while len(h) < n:
                k = len(h)
                h.append(h[-1][:-1] * np.uint64(0x9E3779B97F4A7C15) + h[0][k:])
        return h[n - 1]

    def _groups(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions in hash order, stable; True where a position's n-gram is new in that order)."""
        h = self.ngram_hashes(n)
        order = np.argsort(h, kind="stable")
        s = h[order]
        new = np.empty(len(s), dtype=bool)
        new[0] = True
        np.not_equal(s[1:], s[:-1], out=new[1:])
        return order, new

    def top_ngram_fraction(self, n: int) -> float:
        """Share of word characters in the most frequent word n-gram (the longest if tied), counting
        each occurrence; 0 when no n-gram occurs twice."""
        if self.num_words < n + 1 or self.num_word_chars == 0:
            return 0.0
        order, new = self._groups(n)
        firsts = np.flatnonzero(new)
        counts = np.diff(firsts, append=len(order))
        top = int(counts.max())
        if top < 2:
            return 0.0
        starts = order[firsts[counts == top]]  # stable sort: each group's first is its earliest
        ends = self.word_ends
        return top * int((ends[starts + n] - ends[starts]).max()) / self.num_word_chars

    def dup_ngram_fraction(self, n: int) -> float:
        """Share of word characters covered by word n-grams that occurred before in the document.

        Like Gopher (and datatrove), a repeat counts, its first occurrence does not. Every word
        covered by a repeated (n+1)-gram is covered by a repeated n-gram, so the fraction only
        falls as n grows: callers use that to skip larger n (`dup_ngram_bound`)."""
        if n not in self._dup_fractions:
            self._dup_fractions[n] = self._dup_ngram_fraction(n)
        return self._dup_fractions[n]

    def _dup_ngram_fraction(self, n: int) -> float:
        m = self.num_words
        if m < n + 1 or self.num_word_chars == 0:
            return 0.0
        order, new = self._groups(n)
        starts = order[~new]  # a repeat: not the first (earliest) of its group
        if len(starts) == 0:
            return 0.0
        edges = np.bincount(starts, minlength=m + 1) - np.bincount(starts + n, minlength=m + 1)
        covered = np.cumsum(edges[:m]) > 0
        lengths = np.diff(self.word_ends)
        return float(lengths[covered].sum()) / self.num_word_chars

    def dup_ngram_bound(self, n: int) -> float | None:
        """An upper bound on `dup_ngram_fraction(n)` already known from a smaller n, if any."""
        known = [f for k, f in self._dup_fractions.items() if k <= n]
        return min(known) if known else None
