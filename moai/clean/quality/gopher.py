"""Gopher's quality and repetition filters (Rae et al. 2021, table A1)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from itertools import compress
from operator import not_

from moai.clean.quality.doc import _ELLIPSES, _Doc
from moai.clean.quality.rule import Check, _dup_chars, _rule, _share

_BULLET = re.compile(r"^[•\-*·●◦▪‣–—►▶→ㆍ■□◆◇○➤✓✔]")
_LETTER = re.compile(r"[^\W\d_]")

# Gopher's eight English stop words; for other Latin-script languages, the same number of their
# most frequent function words (a German page must not be dropped for lacking 'the'). A document
# passes with `min` distinct stop words of any one language.
_STOP_WORDS = {
    "en": "the be to of and that have with",
    "de": "der die das und ist zu nicht mit",
    "fr": "le la les et est des que une",
    "es": "el la los que en por con una",
    "it": "il di che non per una con sono",
    "pt": "os que em do da para com uma",
    "nl": "de het een en van dat niet ook",
}
_STOP_SETS = [frozenset(v.split()) for v in _STOP_WORDS.values()]
# Korean has no stop words but particles and endings at the end of an eojeol (after a stem of at
# least one syllable); keyword lists and menus are bare nouns. A Korean document passes with `min`
# distinct ones of these.
_KO_ENDINGS_1 = frozenset("은 는 을 를 의 에 로 와 과 도 만".split())
_KO_ENDINGS_2 = frozenset(
    "에서 에게 으로 까지 부터 처럼 보다 하고 하는 하여 해서 지만 면서 "
    "했다 한다 된다 있다 없다 이다 니다 었다 았다 였다".split()
)


@_rule("gopher:word_count", "words in the document, between min and max", min=50, max=100_000)
def _word_count(d: _Doc, p: Mapping[str, float]) -> bool:
    return p["min"] <= d.num_words <= p["max"]


@_rule(
    "gopher:mean_word_length",
    "mean word length in characters within [min, max]; Hangul text: in syllables within "
    "[hangul_min, hangul_max] (an eojeol is ~3 syllables); Han, kana and Thai text: not judged",
    min=3,
    max=10,
    hangul_min=2,
    hangul_max=7,
)
def _mean_word_length(d: _Doc, p: Mapping[str, float]) -> bool:
    if d.script == "unspaced":
        return True
    if d.num_words == 0:
        return False
    lo, hi = (p["hangul_min"], p["hangul_max"]) if d.script == "hangul" else (p["min"], p["max"])
    return lo <= d.num_word_chars / d.num_words <= hi


@_rule("gopher:symbol_ratio", "'#' per word, and '...' or '…' per word, each at most max", max=0.1)
def _symbol_ratio(d: _Doc, p: Mapping[str, float]) -> bool:
    n = max(d.num_words, 1)
    t = d.text
    return t.count("#") / n <= p["max"] and (t.count("...") + t.count("…")) / n <= p["max"]


@_rule("gopher:bullet_lines", "share of lines that start with a bullet (• - * · ...), at most max", max=0.9)
def _bullet_lines(d: _Doc, p: Mapping[str, float]) -> bool:
    return _share(sum(1 for line in d.lines if _BULLET.match(line)), len(d.lines)) <= p["max"]


@_rule("gopher:ellipsis_lines", "share of lines that end with '...' or '…', at most max", max=0.3)
def _ellipsis_lines(d: _Doc, p: Mapping[str, float]) -> bool:
    return _share(sum(1 for core in d.line_cores if core.endswith(_ELLIPSES)), len(d.lines)) <= p["max"]


@_rule("gopher:alpha_words", "share of words with a letter (any script), at least min", min=0.8)
def _alpha_words(d: _Doc, p: Mapping[str, float]) -> bool:
    if d.num_words == 0:
        return False
    # most words are all letters (str.isalpha, in C); only the others are searched for a letter
    others = compress(d.words, map(not_, map(str.isalpha, d.words)))
    no_letter = sum(1 for w in others if _LETTER.search(w) is None)
    return 1 - no_letter / d.num_words >= p["min"]


@_rule(
    "gopher:stop_words",
    "Latin-script text: at least min distinct stop words of one language (Gopher's English "
    "8: the be to of and that have with; or German, French, Spanish, Italian, Portuguese, Dutch); "
    "Hangul text: at least min distinct particles or endings (은 는 을 를 의 에 ... 했다 있다); "
    "other scripts: not judged",
    min=2,
)
def _stop_words(d: _Doc, p: Mapping[str, float]) -> bool:
    if d.script == "latin":
        vocab = set(d.words)
        return max(sum(w in vocab or w.capitalize() in vocab for w in s) for s in _STOP_SETS) >= p["min"]
    if d.script == "hangul":
        ws = d.words
        found = {w[-1] for w in ws if len(w) >= 2} & _KO_ENDINGS_1
        found |= {w[-2:] for w in ws if len(w) >= 3} & _KO_ENDINGS_2
        return len(found) >= p["min"]
    return True


@_rule("gopher:dup_lines", "share of lines that repeat an earlier line, at most max", max=0.3)
def _dup_lines(d: _Doc, p: Mapping[str, float]) -> bool:
    return _share(len(d.lines) - len(d.line_counts), len(d.lines)) <= p["max"]


@_rule("gopher:dup_paragraphs", "share of paragraphs that repeat an earlier one, at most max", max=0.3)
def _dup_paragraphs(d: _Doc, p: Mapping[str, float]) -> bool:
    paras = d.paragraphs
    return _share(len(paras) - len(set(paras)), len(paras)) <= p["max"]


@_rule("gopher:dup_line_chars", "share of line characters in repeated lines, at most max", max=0.2)
def _dup_line_chars(d: _Doc, p: Mapping[str, float]) -> bool:
    return _share(_dup_chars(d.line_counts), d.line_chars) <= p["max"]


@_rule("gopher:dup_paragraph_chars", "share of paragraph characters in repeated paragraphs, at most max", max=0.2)
def _dup_paragraph_chars(d: _Doc, p: Mapping[str, float]) -> bool:
    paras = d.paragraphs
    return _share(_dup_chars(Counter(paras)), sum(map(len, paras))) <= p["max"]


def _top_ngram(n: int) -> Check:
    def check(d: _Doc, p: Mapping[str, float]) -> bool:
        return d.top_ngram_fraction(n) <= p["max"]

    return check


def _dup_ngram(n: int) -> Check:
    def check(d: _Doc, p: Mapping[str, float]) -> bool:
        bound = d.dup_ngram_bound(n)
        if bound is not None and bound <= p["max"]:
            return True
        return d.dup_ngram_fraction(n) <= p["max"]

    return check


for _n, _max in ((2, 0.20), (3, 0.18), (4, 0.16)):
    _rule(
        f"gopher:top_{_n}gram",
        f"share of word characters in the most frequent word {_n}-gram, at most max",
        max=_max,
    )(_top_ngram(_n))
for _n, _max in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)):
    _rule(
        f"gopher:dup_{_n}gram",
        f"share of word characters in repeated word {_n}-grams, at most max",
        max=_max,
    )(_dup_ngram(_n))
