"""A rule (a named test of one document with named parameters), the table every rule family
registers into (`_RULES`), and the verdicts of a judge."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from moai.clean.quality.doc import _Doc

Check = Callable[["_Doc", Mapping[str, float]], bool]


@dataclass(frozen=True)
class Rule:
    """A named test: `check(doc, params)` is True when the document passes."""

    name: str
    params: Mapping[str, float]
    check: Check = field(repr=False)
    help: str = field(default="", repr=False)

    def passes(self, text: str) -> bool:
        return self.check(_Doc(text), self.params)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled by name (worker processes): some checks are closures, which pickle cannot carry
        return (_named_rule, (self.name, dict(self.params)))


def _named_rule(name: str, params: dict[str, float]) -> Rule:
    rule = _RULES[name]
    return Rule(name, params, rule.check, rule.help)


def describe(rule: Rule) -> str:
    """The rule and its parameters in one line, e.g. `gopher:word_count(min=50, max=100000)`."""
    return f"{rule.name}({', '.join(f'{k}={v:g}' for k, v in rule.params.items())})"


@dataclass
class Verdicts:
    """What a judge said about each text, in order: None (kept) or the first failing rule's name."""

    reasons: list[str | None]
    code_exempt: int = 0  # texts kept without being judged because they are code (`moai.clean.code`)

    @property
    def kept(self) -> int:
        return sum(r is None for r in self.reasons)

    def dropped(self) -> dict[str, int]:
        """Drops per reason, most frequent first."""
        return dict(Counter(r for r in self.reasons if r is not None).most_common())


_RULES: dict[str, Rule] = {}


def _rule(name: str, help: str, **params: float) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        _RULES[name] = Rule(name, dict(params), check, help)
        return check

    return register


def _share(count: int, total: int) -> float:
    return count / total if total else 0.0


def _dup_chars(counts: Counter[str]) -> int:
    return sum(len(s) * (c - 1) for s, c in counts.items() if c > 1)
