"""FineWeb's line and duplication filters (Penedo et al. 2024)."""

from __future__ import annotations

from collections.abc import Mapping

from moai.clean.quality.doc import _TERMINAL_SET, _Doc
from moai.clean.quality.rule import _dup_chars, _rule, _share


@_rule("fineweb:line_punct", "share of lines that end in terminal punctuation, at least min", min=0.12)
def _line_punct(d: _Doc, p: Mapping[str, float]) -> bool:
    if not d.lines:
        return False
    return _share(sum(1 for core in d.line_cores if core[-1:] in _TERMINAL_SET), len(d.lines)) >= p["min"]


@_rule("fineweb:short_lines", "share of lines of at most length characters, at most max", max=0.67, length=30)
def _short_lines(d: _Doc, p: Mapping[str, float]) -> bool:
    limit = p["length"]
    return _share(sum(1 for line in d.lines if len(line) <= limit), len(d.lines)) <= p["max"]


@_rule("fineweb:char_dup", "characters in repeated lines over all characters but newlines, at most max", max=0.01)
def _char_dup(d: _Doc, p: Mapping[str, float]) -> bool:
    return _share(_dup_chars(d.line_counts), len(d.text) - d.text.count("\n")) <= p["max"]


@_rule("fineweb:newlines", "newlines per word, at most max", max=0.3)
def _newlines(d: _Doc, p: Mapping[str, float]) -> bool:
    return d.text.count("\n") <= p["max"] * d.num_words
