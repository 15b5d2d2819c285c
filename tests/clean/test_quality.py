"""Quality rules: good Korean and English prose is kept by every set, junk is dropped for the
expected reason, code is skipped unless asked, thresholds override defaults, bad names fail in one line."""

from __future__ import annotations

import pickle

import pytest
from test_words import CODE, EN_ESSAY, EN_NEWS, EN_PROSE, EN_WRAPPED, KO_BLOG, KO_NEWS, KO_PROSE, OTHER

from moai.clean.quality import RULES, SETS, describe, judge, resolve
from moai.config import QualityConfig
from moai.errors import ConfigError


def reasons(texts, rules="gopher", code="skip", **thresholds):
    cfg = QualityConfig(rules=rules, thresholds={k.replace("__", ":"): v for k, v in thresholds.items()})
    return judge(texts, resolve(cfg), code=code).reasons


GOOD = [t for t in KO_PROSE + EN_PROSE if t is not EN_WRAPPED]


@pytest.mark.parametrize("rule_set", ["gopher", "c4", "fineweb"])
def test_good_prose_is_kept(rule_set):
    assert reasons(GOOD, rule_set) == [None] * len(GOOD)


def test_chinese_and_japanese_are_judged_on_word_pieces():
    # one word per character would make every CJK document look like a list of 1-letter words
    texts = [OTHER["zh"].replace("。", "。\n"), OTHER["ja"].replace("。", "。\n")]
    assert reasons(texts, ["gopher:word_count", "gopher:mean_word_length", "gopher:stop_words"]) == [None, None]
    assert reasons(texts, "fineweb") == [None, None]


def test_korean_needs_its_own_word_length_bounds():
    # an eojeol is ~3 syllables: English's 'at least 3 characters' would drop Korean news
    assert reasons([KO_NEWS]) == [None]
    assert reasons([KO_NEWS], gopher__mean_word_length={"hangul_min": 3}) == ["gopher:mean_word_length"]
    unspaced = KO_NEWS.replace(" ", "")  # no spacing: one 'word' per sentence
    assert reasons([unspaced], ["gopher:mean_word_length"]) == ["gopher:mean_word_length"]


def test_hard_wrapped_text_fails_c4_as_in_c4():
    # C4 keeps only lines that end a sentence: a book wrapped at 75 columns has few (a known limit)
    assert reasons([EN_WRAPPED], "c4") == ["c4:sentences"]
    assert reasons([EN_WRAPPED], "fineweb") == [None]


KEYWORDS_EN = " ".join(
    ["cheap shoes", "buy shoes online", "discount sneakers", "running shoes sale", "best price shoes"] * 12
)
KEYWORDS_KO = " ".join(["강남 맛집", "강남역 맛집 추천", "데이트 코스", "가성비 맛집", "회식 장소 추천"] * 12)
NAV_MENU = "\n".join(
    f"- {item}"
    for item in "Home About Products Services Blog Contact Careers Press Support FAQ Login Register Cart "
    "Account Orders Wishlist Settings Help Sitemap Privacy Terms Jobs Partners Investors News Events "
    "Stores Gifts Deals Brands Women Men Kids Sale New Arrivals Shoes Bags Jewelry Watches Beauty Home "
    "Kitchen Garden Sports Outdoors Toys Books Music Movies Games Electronics Phones".split()
)
NAV_KO = "\n".join(
    "홈 회사소개 제품 서비스 블로그 고객센터 채용 공지사항 자주묻는질문 로그인 회원가입 장바구니".split() * 3
)
LOREM = EN_NEWS + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.\n"
REPEATED_LINES = "\n".join(
    ["Click here to read more about our latest offers and news."] * 12
    + EN_ESSAY.splitlines()[:1]
    + ["Subscribe to our newsletter and never miss an update from us."] * 12
)
HASHTAGS = "오늘의 여행 사진입니다. " + " ".join(
    f"#여행 #맛집 #일상 #데일리 #{w}" for w in "제주 부산 서울 강릉".split() * 4
)
ELLIPSIS = "\n".join(
    f"{title}..."
    for title in [
        "The ten best places to visit in Korea this spring and why you should go",
        "How a small startup in Seoul changed the way people order food at night",
        "Why experts say the housing market will cool down over the next year",
        "What to pack for a week of hiking in the mountains of Gangwon province",
    ]
    * 3
)
NUMBERS = "\n".join(" ".join(f"{(i * 7919 + j * 104729) % 10000:,}" for j in range(8)) for i in range(12))
SHORT = "안녕하세요. 반갑습니다."


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (KEYWORDS_EN, "gopher:stop_words"),
        (KEYWORDS_KO, "gopher:stop_words"),  # bare nouns: no Korean particles or endings
        (NAV_MENU, "gopher:bullet_lines"),
        (HASHTAGS, "gopher:symbol_ratio"),
        (ELLIPSIS, "gopher:ellipsis_lines"),
        (NUMBERS, "gopher:alpha_words"),
        (REPEATED_LINES, "gopher:dup_lines"),
        (SHORT, "gopher:word_count"),
        (KO_BLOG + "\n\n" + KO_BLOG, "gopher:dup_lines"),  # one line per paragraph: lines repeat first
        (EN_ESSAY.replace(". ", ".\n").replace("\n\n", "\n") + "\nShare this.\n\nShare this.", "gopher:dup_paragraphs"),
        (EN_ESSAY + "\n" + "best deals " * 80, "gopher:top_2gram"),
        ((EN_NEWS.replace("\n", " ") + " ") * 3, "gopher:dup_5gram"),
    ],
)
def test_gopher_drops_junk(text, expected):
    assert reasons([text]) == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (LOREM, "c4:lorem_ipsum"),
        (EN_NEWS + "\nUse {braces} like this.", "c4:curly_bracket"),
        (NAV_KO, "c4:sentences"),
        (SHORT, "c4:sentences"),
        ("\n".join(["Please enable JavaScript in your browser to view this page."] * 6), "c4:sentences"),
        ("\n".join(["This site uses cookies to improve your experience."] * 6), "c4:sentences"),
    ],
)
def test_c4_drops_junk(text, expected):
    assert reasons([text], "c4") == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (NAV_KO, "fineweb:line_punct"),
        ("\n".join(["Short line one.", "And two.", "Three!", EN_ESSAY.splitlines()[0]]), "fineweb:short_lines"),
        (REPEATED_LINES, "fineweb:char_dup"),
        (
            "\n".join(
                [  # two long words a line: over 30 characters, yet a newline every 2 words
                    "Telecommunications conglomerates.",
                    "Extraordinary circumstances prevailed.",
                    "Incomprehensibilities abounded everywhere.",
                    "Representatives disagreed uncharacteristically.",
                    "Internationalization accelerated.",
                ]
            ),
            "fineweb:newlines",
        ),
    ],
)
def test_fineweb_drops_junk(text, expected):
    assert reasons([text], "fineweb") == [expected]


def test_code_is_skipped_unless_judged():
    code = list(CODE.values())
    verdicts = judge([*code, SHORT], resolve(QualityConfig(rules="gopher")))
    assert verdicts.reasons == [None] * len(code) + ["gopher:word_count"]
    assert verdicts.code_exempt == len(code)
    assert verdicts.kept == len(code)
    assert verdicts.dropped() == {"gopher:word_count": 1}
    judged = judge(code, resolve(QualityConfig(rules="c4")), code="judge")
    assert judged.code_exempt == 0
    assert all(judged.reasons)


def test_thresholds_override_defaults():
    assert reasons([SHORT]) == ["gopher:word_count"]
    assert reasons([SHORT], ["gopher:word_count"], gopher__word_count={"min": 2}) == [None]
    rules = resolve(QualityConfig(rules="fineweb", thresholds={"fineweb:short_lines": {"max": 1, "length": 10}}))
    short = next(r for r in rules if r.name == "fineweb:short_lines")
    assert short.params == {"max": 1, "length": 10}
    assert RULES["fineweb:short_lines"].params == {"max": 0.67, "length": 30}  # defaults untouched


def test_resolve_sets_and_lists():
    assert [r.name for r in resolve(QualityConfig(rules="c4"))] == SETS["c4"]
    names = [r.name for r in resolve(QualityConfig(rules=["c4:lorem_ipsum", "fineweb", "c4:lorem_ipsum"]))]
    assert names == ["c4:lorem_ipsum", *SETS["fineweb"]]
    assert all(name.startswith(f"{s}:") for s, names in SETS.items() for name in names)
    assert len(SETS["gopher"]) == 20


@pytest.mark.parametrize(
    ("rules", "thresholds", "message"),
    [
        (["gopher:wordcount"], {}, "quality.rules: unknown rule 'gopher:wordcount' (did you mean gopher:word_count?)"),
        (["gopherr"], {}, "(did you mean gopher?)"),
        ("gopher", {"gopher:word_cnt": {"min": 1}}, "quality.thresholds: unknown rule 'gopher:word_cnt' (did you"),
        ("gopher", {"gopher:word_count": {"mn": 1}}, "unknown parameter 'mn' (did you mean min?); valid: min, max"),
        ("c4", {"gopher:word_count": {"min": 1}}, "gopher:word_count is not one of the rules chosen"),
    ],
)
def test_bad_names_fail_in_one_line(rules, thresholds, message):
    with pytest.raises(ConfigError) as e:
        resolve(QualityConfig(rules=rules, thresholds=thresholds))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_every_rule_passes_empty_and_judges_none_text():
    # a null text (missing field) is judged as empty: dropped, never an exception
    assert reasons(["", None], "gopher") == ["gopher:word_count"] * 2
    for name, rule in RULES.items():
        assert isinstance(rule.passes(""), bool), name


def test_rules_pickle_and_describe():
    # the stage sends rules to worker processes and writes their descriptions into its settings
    rules = resolve(QualityConfig(rules="gopher", thresholds={"gopher:top_2gram": {"max": 0.3}}))
    again = pickle.loads(pickle.dumps(rules))
    assert [(r.name, dict(r.params)) for r in again] == [(r.name, dict(r.params)) for r in rules]
    assert judge([KO_NEWS, SHORT], again).reasons == [None, "gopher:word_count"]
    assert describe(rules[0]) == "gopher:word_count(min=50, max=100000)"
    assert describe(next(r for r in rules if r.name == "gopher:top_2gram")) == "gopher:top_2gram(max=0.3)"
