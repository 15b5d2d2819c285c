"""Heuristic quality rules (Gopher, C4, FineWeb), made to judge Korean as fairly as English.

A rule is a named test of one document with named parameters: `gopher:word_count` with
`{min: 50, max: 100000}`. Rules come in three sets, after the papers and datatrove's filters
(same rules and default thresholds, written for moai; what differs is said at the rule):

- gopher: Gopher's quality and repetition filters (Rae et al. 2021, table A1);
- c4: C4's page filters (Raffel et al. 2020), judged per page: moai keeps or drops rows, it does
  not rewrite them, so C4's line filters decide which lines count towards the sentence minimum;
- fineweb: FineWeb's line and duplication filters (Penedo et al. 2024).

Words are `moai.clean.words.words`: a Korean eojeol is one word, and Chinese, Japanese and Thai
runs are cut into word-sized pieces instead of one word per character (the miscount datatrove
users report in #135 and #202). Rules that only make sense for some scripts say so: English
stop words are asked of Latin-script text only, Korean text is asked for Korean particles
instead, and mean word length has Korean bounds in syllables and no bound for unspaced scripts.
Documents that are code (`moai.clean.code.is_code`: code files, and prose records that carry a
program, such as an instruction and its solution) are not judged unless asked (`code="judge"`).

Cost: each document's lines, words and n-grams are computed once and shared by the rules (a
`_Doc`); the work is regular expressions, `collections.Counter` and small NumPy arrays, with no
Python loop per character. Rules run in order and stop at the first failure. On one core of a
Xeon, over Korean and English documents of 2–5 KB (3.7 KB on average) that pass every rule (the
slowest case): gopher ~1,200 documents/s, c4 ~5,500, fineweb ~3,600, all three ~1,200; word
segmentation is ~130 µs of a document's ~800 µs, the top 2/3/4-gram rules ~240 µs together.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from moai.clean.code import is_code
from moai.clean.quality import c4, fineweb, gopher  # noqa: F401  (each family registers its rules on import)
from moai.clean.quality.doc import _Doc
from moai.clean.quality.rule import _RULES, Rule, Verdicts, _named_rule, describe
from moai.config import QualityConfig
from moai.errors import ConfigError

# The families in the papers' order, whatever order they were imported in (a set's rules keep theirs:
# they run in it and stop at the first failure).
_FAMILIES = ("gopher", "c4", "fineweb")
_ordered = sorted(_RULES.items(), key=lambda item: _FAMILIES.index(item[0].split(":")[0]))
_RULES.clear()
_RULES.update(_ordered)
SETS: dict[str, list[str]] = {s: [name for name in _RULES if name.startswith(s + ":")] for s in _FAMILIES}
RULES: Mapping[str, Rule] = _RULES


# --- configuration -----------------------------------------------------------------------------


def _unknown(where: str, what: str, name: str, valid: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(f"{where}: unknown {what} {name!r}{hint}; valid: {', '.join(valid)}")


def resolve(cfg: QualityConfig) -> list[Rule]:
    """The rules `cfg` asks for, in set order, with its thresholds applied.

    `cfg.rules` is a set name (all its rules) or a list of rule and set names. `cfg.thresholds`
    maps a chosen rule to new values of its parameters. A name that is not a rule, set or
    parameter raises `ConfigError` (one line, with the closest valid name)."""
    asked = [cfg.rules] if isinstance(cfg.rules, str) else list(cfg.rules)
    names: list[str] = []
    for name in asked:
        if name in SETS:
            names.extend(SETS[name])
        elif name in _RULES:
            names.append(name)
        else:
            raise _unknown("quality.rules", "rule", name, [*SETS, *_RULES])
    names = list(dict.fromkeys(names))
    for name, overrides in cfg.thresholds.items():
        if name not in _RULES:
            raise _unknown("quality.thresholds", "rule", name, list(_RULES))
        if name not in names:
            raise ConfigError(
                f"quality.thresholds: {name} is not one of the rules chosen by quality.rules ({', '.join(asked)}); "
                f"add it to quality.rules or remove its thresholds"
            )
        for key in overrides:
            if key not in _RULES[name].params:
                raise _unknown(f"quality.thresholds.{name}", "parameter", key, list(_RULES[name].params) or ["(none)"])
    rules = [_named_rule(name, {**_RULES[name].params, **cfg.thresholds.get(name, {})}) for name in names]
    for rule in rules:  # a range set backwards passes nothing: every document of that rule would go
        for lo, hi in (("min", "max"), ("hangul_min", "hangul_max")):
            if lo in rule.params and hi in rule.params and rule.params[lo] > rule.params[hi]:
                raise ConfigError(
                    f"quality.thresholds.{rule.name}: {lo} {rule.params[lo]:g} is above {hi} {rule.params[hi]:g}, "
                    "so no document could pass"
                )
    return rules


def judge(texts: Sequence[str], rules: Sequence[Rule], *, code: str = "skip") -> Verdicts:
    """For each text, None when it passes every rule, else the name of the first rule it fails.

    `code="skip"`: a text that is code (`moai.clean.code.is_code`) is kept without being judged,
    and counted in `Verdicts.code_exempt`; `code="judge"`: code is judged like prose."""
    if code not in ("skip", "judge"):
        raise ValueError(f"code must be 'skip' or 'judge', not {code!r}")
    reasons: list[str | None] = []
    skipped = 0
    for text in texts:
        text = text or ""
        if code == "skip" and is_code(text):
            reasons.append(None)
            skipped += 1
            continue
        doc = _Doc(text)
        reasons.append(next((r.name for r in rules if not r.check(doc, r.params)), None))
    return Verdicts(reasons, skipped)


__all__ = ["RULES", "SETS", "Rule", "Verdicts", "describe", "judge", "resolve"]
