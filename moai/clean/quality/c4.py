"""C4's page filters (Raffel et al. 2020), judged per page: moai keeps or drops rows, it does not
rewrite them, so C4's line filters decide which lines count towards the sentence minimum."""

from __future__ import annotations

import re
from collections.abc import Mapping

from moai.clean.quality.doc import _CLOSERS, _ELLIPSES, _TERMINAL, _TERMINAL_SET, _Doc
from moai.clean.quality.rule import _rule
from moai.clean.words import words

_SENTENCE_MARK = re.compile(f"[{re.escape(_TERMINAL)}]+[{re.escape(_CLOSERS)}]*(?=\\s|$)|[。！？｡]")
_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]", re.I)
_LOREM = re.compile(r"lorem ipsum", re.I)
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")


@_rule("c4:lorem_ipsum", "no 'lorem ipsum' (any case)")
def _lorem_ipsum(d: _Doc, p: Mapping[str, float]) -> bool:
    t = d.text
    return not ("psum" in t or "PSUM" in t) or _LOREM.search(t) is None


@_rule("c4:curly_bracket", "no '{' (C4's guard against code; code is skipped before it by default)")
def _curly_bracket(d: _Doc, p: Mapping[str, float]) -> bool:
    return "{" not in d.text


@_rule(
    "c4:sentences",
    "at least min sentences on the lines C4 keeps: lines that end in terminal punctuation "
    "(. ! ? \" ' and 。！？, not '...'), with at least min_words_per_line words, no word longer "
    "than max_word_length characters, and no 'javascript' or cookie/privacy-policy phrase "
    "(citations like [1] and [edit] removed first)",
    min=5,
    min_words_per_line=3,
    max_word_length=1000,
)
def _sentences(d: _Doc, p: Mapping[str, float]) -> bool:
    low = d.text.lower()  # lines are searched only when the text has the phrase (substring search in C)
    javascript = "javascript" in low
    policy = any(phrase in low for phrase in _POLICY)
    min_words = p["min_words_per_line"]
    found = 0
    for line, core in zip(d.lines, d.line_cores, strict=True):
        if "[" in line:
            line = _CITATION.sub("", line).rstrip()
            core = line.rstrip(_CLOSERS)
        if core[-1:] not in _TERMINAL_SET or core.endswith(_ELLIPSES):
            continue
        tokens = line.split()
        if len(tokens) < min_words and len(words(line)) < min_words:  # words(): Chinese, Japanese, Thai
            continue
        if max(map(len, tokens)) > p["max_word_length"]:
            continue
        if (javascript or policy) and _mentions(line.lower(), javascript, policy):
            continue
        found += max(1, len(_SENTENCE_MARK.findall(line)))
        if found >= p["min"]:
            return True
    return False


def _mentions(low: str, javascript: bool, policy: bool) -> bool:
    return (javascript and "javascript" in low) or (policy and any(phrase in low for phrase in _POLICY))
