"""A held-out-style corpus for the cleaning stages, with its ground truth: what each document is.

    python benchmarks/clean_corpus.py OUT_DIR --docs 5000 [--seed 0] [--mix mixed|english]

Writes OUT_DIR/data.jsonl (one {"text": ...} a line), OUT_DIR/evals.jsonl (evaluation items,
{"id", "question"}) and OUT_DIR/truth.json (one entry a line of data.jsonl). `generate()` does
the same from Python and returns the paths and the entries.

The documents are built from word lists and sentence templates, so nothing is downloaded:

- prose: English and Korean (eojeol with the particle that fits the noun's final consonant:
  학교에서, 책을, 친구와; verbs in several endings: 공부했다, 갔습니다), paragraphs of 3–8
  sentences, 100–2,000 words (log-normal, median ~350);
- code: Python, JavaScript and C files of 4–30 functions, comments in Korean in about a third;
- other languages (kind `other`, a few percent): Japanese, Chinese, German, French, Spanish and
  Russian documents of 5–12 distinct sentences from a bank of 15 real sentences per language;
- low quality (kind `low`): keyword spam, navigation menus, lorem ipsum, one line repeated, symbol
  soup;
- exact duplicates (kind `exact_dup`, `original` = the line copied, always an earlier line):
  identical, whitespace-only changes (doubled spaces, trailing spaces, blank lines), or NFKC-only
  changes (a span in full-width forms, Korean decomposed into conjoining jamo);
- near-duplicates (kind `near_dup`, `original` an earlier line): 1–6% of the words replaced,
  inserted or deleted, scattered or in one run, with `jaccard` the true Jaccard similarity of the
  two documents' word 5-gram sets (`moai.clean.shingles.shingle_set`, as dedup verifies);
- planted (kind `planted`, `eval_id`): an English or Korean document with one evaluation item
  (15–40 words) inside it, its case and punctuation changed. evals.jsonl has four unplanted
  items for each planted one.

Only prose and code documents that are not planted are copied, so the copies' originals are
unique. `--mix english` makes the prose English-heavy (for tools whose tokenizers are tuned to
English: benchmarks/dedup.py).
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` (imported by pandas, which
# pyarrow imports) when a script of this folder runs, because Python puts the script's folder
# first on sys.path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import math
import random
import re
import textwrap
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# Shares of the documents by kind (the rest, after the copies, is prose and code).
MIXES = {
    "mixed": {"en": 0.40, "ko": 0.24, "code": 0.10, "other": 0.04, "low": 0.04, "planted": 0.02,
              "exact_dup": 0.08, "near_dup": 0.08},
    "english": {"en": 0.70, "ko": 0.04, "code": 0.04, "other": 0.02, "low": 0.02, "planted": 0.02,
                "exact_dup": 0.08, "near_dup": 0.08},
    # Korean, English and code, most of the code instruction + Python solution records (issue 24)
    "code": {"en": 0.25, "ko": 0.20, "code": 0.06, "instruct": 0.34, "other": 0.06, "low": 0.06,
             "planted": 0.01, "planted_code": 0.02},
}  # fmt: skip
NGRAM = 5  # the n-gram of the recorded Jaccard (dedup.near.ngram's default)


# --- English -----------------------------------------------------------------------------------

EN = {
    "noun": """
        city council committee report study survey school teacher student village farmer market river bridge
        railway station hospital doctor nurse patient museum library artist writer novel museum garden forest
        mountain valley harbor ship engineer factory worker company manager budget policy law court judge
        election voter campaign newspaper journalist editor scientist laboratory experiment theory climate
        storm drought harvest festival concert musician orchestra audience game team coach player stadium
        season recipe kitchen restaurant customer price product network system computer program software
        server database model algorithm language dictionary translation history century empire kingdom
        war treaty border province region neighborhood street apartment building architect design plan
        project proposal meeting conference lecture university professor course exam result answer question
        problem solution method approach process change growth decline population family child parent
        generation tradition culture religion temple church castle island coast beach ocean lake bird
        animal species plant tree flower insect energy fuel battery engine vehicle road highway traffic
        accident weather winter summer spring autumn morning evening night decade moment reason effect
    """.split(),
    "adj": """
        small large old new early late local national public private modern ancient famous quiet busy
        important difficult simple careful serious strong weak bright dark cold warm heavy light rapid slow
        recent former main major minor common rare strange familiar useful expensive cheap narrow wide
        long short deep shallow clear complex practical political economic social scientific historical
        cultural natural medical technical digital rural urban northern southern eastern western coastal
    """.split(),
    "verb_past": """
        built opened closed studied described announced reported discovered changed improved reduced
        increased visited explained collected published designed tested measured repaired replaced
        supported criticized questioned compared organized launched finished started approved rejected
        protected damaged restored examined recorded introduced completed expanded moved planned
    """.split(),
    "verb": """
        build open close study describe announce report discover change improve reduce increase visit
        explain collect publish design test measure repair replace support compare organize launch finish
        start approve protect restore examine record introduce complete expand move plan teach learn
    """.split(),
    "adv": """
        quickly slowly carefully quietly finally recently suddenly gradually clearly eventually nearly
        often rarely usually always never already still simply openly widely largely mostly partly
    """.split(),
    "name": """
        Anna Peter Maria John Laura David Sofia Daniel Emma Thomas Clara Samuel Helen Martin Alice Oliver
        Grace Henry Julia Victor Nora Felix Irene Oscar Ruth Hugo Elena Simon Lucy Arthur
    """.split(),
    "place": """
        Lisbon Oslo Kyoto Denver Cairo Lima Bergen Porto Dublin Quebec Leeds Osaka Perth Tartu Galway
        Malmo Bilbao Turin Graz Ghent Brno Split Cork Aarhus Salzburg Tromso Nantes Lyon Hobart Dundee
    """.split(),
}
EN_TEMPLATES = [
    "The {adj} {noun} in {place} was {verb_past} by the {noun} last {season}.",
    "In {year}, the {noun} of {place} {verb_past} a {adj} {noun} near the {noun}.",
    "{name} {adv} {verb_past} the {adj} {noun} and wrote about it in a {noun}.",
    "According to the {noun}, the {noun} {verb_past} the {noun} after a {adj} {noun}.",
    "Many people in the {noun} believe that the {noun} should {verb} the {adj} {noun}.",
    "It is not {adj} to {verb} a {noun} without a {adj} {noun}.",
    "When the {noun} {verb_past} the {noun}, {name} {adv} {verb_past} the {noun}.",
    "The {noun} has {verb_past} more than {number} {noun}s since {year}.",
    "{name} said that the {adj} {noun} would {verb} the {noun} by the end of the {noun}.",
    "Although the {noun} was {adj}, the {noun} {verb_past} it {adv}.",
    "Some {noun}s {adv} {verb} the {noun}, while others prefer to {verb} the {noun}.",
    "The {adj} {noun} of the {noun} remains one of the most {adj} {noun}s in {place}.",
    "After the {noun}, {name} and {name} {verb_past} a {adj} {noun} together.",
    "Critics {verb_past} the {noun}, arguing that its {noun} was too {adj}.",
    "A {adj} {noun} can {verb} a {noun} in less than {number} {unit}.",
    "Visitors to {place} often {verb} the {adj} {noun} before they {verb} the {noun}.",
    "The {noun} {verb_past} {number} {noun}s, {number} of which were {adj}.",
    "Why the {noun} {verb_past} the {noun} is still a {adj} {noun} for the {noun}.",
    "Over the {noun}, the {adj} {noun} {adv} became a {noun} for the whole {noun}.",
    "Experts from {place} {verb_past} that the {noun} was {adj} and {adj}.",
]
EN_EXTRA = {
    "season": "winter summer spring autumn year month week".split(),
    "unit": "minutes hours days weeks months years".split(),
}


def _fill(rng: random.Random, template: str, bank: dict[str, list[str]]) -> str:
    def slot(m: re.Match) -> str:
        k = m.group(1)
        if k == "year":
            return str(rng.randint(1850, 2024))
        if k == "number":
            return str(rng.choice([rng.randint(2, 99), rng.randint(100, 9999)]))
        return rng.choice(bank[k])

    return re.sub(r"\{(\w+)\}", slot, template)


def _length(rng: random.Random, lo: int = 100, hi: int = 2000, median: float = 350) -> int:
    return max(lo, min(hi, int(rng.lognormvariate(math.log(median), 0.7))))


def en_sentence(rng: random.Random) -> str:
    s = _fill(rng, rng.choice(EN_TEMPLATES), EN | EN_EXTRA)
    return s[0].upper() + s[1:]


def en_prose(rng: random.Random, words: int | None = None) -> str:
    words = words or _length(rng)
    paragraphs, n = [], 0
    while n < words:
        para = [en_sentence(rng) for _ in range(rng.randint(3, 8))]
        n += sum(len(s.split()) for s in para)
        paragraphs.append(" ".join(para))
    title = " ".join(
        w.capitalize() for w in (rng.choice(EN["adj"]), rng.choice(EN["noun"]), "in", rng.choice(EN["place"]))
    )
    return title + "\n\n" + "\n\n".join(paragraphs) + "\n"


# --- Korean -----------------------------------------------------------------------------------

KO = {
    "place": """
        학교 도서관 회사 시장 병원 공원 박물관 식당 카페 역 공항 항구 마을 도시 시청 교실 연구실 공장
        체육관 극장 미술관 해변 산 강 호수 숲 농장 사무실 대학교 정류장 백화점 서점 시골 골목 광장
    """.split(),
    "thing": """
        책 편지 사진 자료 보고서 계획 문제 질문 답 결과 음식 커피 노래 영화 소설 그림 지도 기사 기록
        물건 선물 옷 가방 우산 자전거 컴퓨터 휴대폰 프로그램 데이터 모델 정책 예산 제도 행사 축제
        경기 시험 수업 강의 회의 발표 실험 조사 논문 제품 서비스 기술 언어 문화 역사 전통 환경 날씨
    """.split(),
    "person": """
        학생 선생님 친구 동생 형 누나 언니 부모님 할머니 할아버지 의사 간호사 기자 작가 교수 연구원
        직원 사장 손님 이웃 시민 주민 농부 요리사 가수 배우 감독 선수 관계자 전문가 공무원 아이
    """.split(),
    "time": """
        어제 오늘 내일 지난주 다음주 주말 아침 저녁 밤 오후 올해 작년 내년 요즘 최근 매일 가끔
        지난달 봄에 여름에 가을에 겨울에 새벽에 점심에 방학에 연휴에
    """.split(),
    "adv": """
        열심히 천천히 빨리 조용히 함께 혼자 다시 처음으로 드디어 갑자기 자주 꾸준히 충분히 정말
        매우 조금 많이 겨우 오랫동안 미리 직접 새로 크게 조심스럽게
    """.split(),
    "adj": """
        작은 큰 새로운 오래된 조용한 유명한 중요한 어려운 쉬운 따뜻한 차가운 깨끗한 복잡한 간단한
        아름다운 낯선 익숙한 다양한 특별한 평범한 비싼 저렴한 넓은 좁은 밝은 어두운
    """.split(),
}
KO_PREDICATES = "좋았다 어려웠다 쉬웠다 복잡했다 재미있었다 비쌌다 조용했다 길었다 짧았다 훌륭했다".split()
# verbs: (stem forms by ending): past plain, past polite, present polite, connective
KO_VERBS = [
    ("공부했다", "공부했습니다", "공부해요", "공부하고"),
    ("읽었다", "읽었습니다", "읽어요", "읽고"),
    ("만들었다", "만들었습니다", "만들어요", "만들고"),
    ("준비했다", "준비했습니다", "준비해요", "준비하고"),
    ("발표했다", "발표했습니다", "발표해요", "발표하고"),
    ("조사했다", "조사했습니다", "조사해요", "조사하고"),
    ("찾았다", "찾았습니다", "찾아요", "찾고"),
    ("보았다", "보았습니다", "봐요", "보고"),
    ("소개했다", "소개했습니다", "소개해요", "소개하고"),
    ("정리했다", "정리했습니다", "정리해요", "정리하고"),
    ("기록했다", "기록했습니다", "기록해요", "기록하고"),
    ("설명했다", "설명했습니다", "설명해요", "설명하고"),
    ("사용했다", "사용했습니다", "사용해요", "사용하고"),
    ("바꾸었다", "바꾸었습니다", "바꿔요", "바꾸고"),
    ("확인했다", "확인했습니다", "확인해요", "확인하고"),
    ("나누었다", "나누었습니다", "나눠요", "나누고"),
]
KO_MOVES = [
    ("갔다", "갔습니다", "가요", "가서"),
    ("왔다", "왔습니다", "와요", "와서"),
    ("들렀다", "들렀습니다", "들러요", "들러서"),
]


def _batchim(word: str) -> bool:
    last = word[-1]
    return "가" <= last <= "힣" and (ord(last) - 0xAC00) % 28 != 0


def _p(word: str, with_final: str, without: str) -> str:
    """The noun with the particle that fits its final sound (을/를, 이/가, 은/는, 과/와)."""
    return word + (with_final if _batchim(word) else without)


KO_TEMPLATES = [
    "{time} {person/은} {place}에서 {thing/을} {adv} {V}.",
    "{person/과} 함께 {place}에 {MC} {adj} {thing/을} {V}.",
    "{place}의 {person/이} {adj} {thing}에 대해 {V}.",
    "{thing/은} {adv} {adj} {thing/이} 되었다고 {person/이} 말했다.",
    "{time} {place}에 {M}. 그곳에서 {thing/을} {C} {thing/을} {V}.",
    "{N}명의 {person/이} {place}에서 열린 {thing}에 참여했다.",
    '{person/은} "{thing/이} 생각보다 {P}"고 전했다.',
    "{Y}년 {MO}월 {place}에서 {adj} {thing/이} 처음 공개되었다.",
]
_PARTICLES = {"은": ("은", "는"), "을": ("을", "를"), "이": ("이", "가"), "과": ("과", "와")}


def ko_sentence(rng: random.Random) -> str:
    ending = rng.randrange(3)
    verb, move = rng.choice(KO_VERBS), rng.choice(KO_MOVES)
    fixed = {
        "V": verb[ending],
        "C": verb[3],
        "M": move[ending],
        "MC": move[3],
        "P": rng.choice(KO_PREDICATES),
        "N": str(rng.randint(2, 300)),
        "Y": str(rng.randint(1990, 2024)),
        "MO": str(rng.randint(1, 12)),
    }

    def slot(m: re.Match) -> str:
        name, _, particle = m.group(1).partition("/")
        if name in fixed:
            return fixed[name]
        word = rng.choice(KO[name])
        return _p(word, *_PARTICLES[particle]) if particle else word

    return re.sub(r"\{([\w/]+)\}", slot, rng.choice(KO_TEMPLATES))


def ko_prose(rng: random.Random, words: int | None = None) -> str:
    words = words or _length(rng, median=250)
    paragraphs, n = [], 0
    while n < words:
        para = [ko_sentence(rng) for _ in range(rng.randint(3, 8))]
        n += sum(len(s.split()) for s in para)
        paragraphs.append(" ".join(para))
    title = f"{rng.choice(KO['adj'])} {rng.choice(KO['place'])}의 {rng.choice(KO['thing'])} 이야기"
    return title + "\n\n" + "\n\n".join(paragraphs) + "\n"


# --- code -------------------------------------------------------------------------------------

IDENT = """
    user item order price total count index value result data config path name size buffer record
    table row column key cache queue node tree graph edge weight score token batch chunk offset limit
    page file line text word entry event handler request response session account payment report
""".split()
KO_COMMENTS = [
    "사용자 목록을 불러온다",
    "입력 값이 비어 있으면 건너뛴다",
    "결과를 캐시에 저장한다",
    "합계를 다시 계산한다",
    "파일이 없으면 새로 만든다",
    "오류가 나면 기본값을 돌려준다",
    "정렬된 순서를 유지한다",
    "중복된 항목을 제거한다",
    "요청 시간이 너무 길면 중단한다",
    "다음 페이지가 있는지 확인한다",
    "설정 파일에서 값을 읽는다",
]
EN_COMMENTS = [
    "load the list of users",
    "skip empty input",
    "store the result in the cache",
    "recompute the total",
    "create the file if it does not exist",
    "fall back to the default on error",
    "keep the sorted order",
    "drop duplicate entries",
    "give up when the request takes too long",
    "check whether there is a next page",
]


def _ident(rng: random.Random, parts: int = 2, camel: bool = False) -> str:
    words = [rng.choice(IDENT) for _ in range(parts)]
    if camel:
        return words[0] + "".join(w.capitalize() for w in words[1:])
    return "_".join(words)


def _comment(rng: random.Random, korean: bool) -> str:
    return rng.choice(KO_COMMENTS if korean else EN_COMMENTS)


def python_code(rng: random.Random, korean: bool) -> str:
    out = [f'"""{_comment(rng, korean)}."""', "", "import json", "import os", ""]
    for _ in range(rng.randint(4, 30)):
        f, a, b = _ident(rng), _ident(rng, 1), _ident(rng, 1) + "s"
        body = [
            f"def {f}({a}, {b}=None, limit={rng.randint(1, 500)}):",
            f"    # {_comment(rng, korean)}",
            f"    if {b} is None:",
            f"        {b} = []",
            f"    {_ident(rng)} = 0",
            f"    for i, {_ident(rng, 1)} in enumerate({b}):",
            "        if i >= limit:",
            "            break",
            f"        {a} = {a} + {rng.randint(1, 9)} * i",
            f"    return {{'{_ident(rng, 1)}': {a}, 'count': len({b})}}",
            "",
            "",
        ]
        out.extend(body[: rng.randint(6, len(body))] if rng.random() < 0.3 else body)
    return "\n".join(out) + "\n"


def js_code(rng: random.Random, korean: bool) -> str:
    out = [f"// {_comment(rng, korean)}", "'use strict';", ""]
    for _ in range(rng.randint(4, 30)):
        f, a = _ident(rng, camel=True), _ident(rng, 1)
        out += [
            f"function {f}({a}, options = {{}}) {{",
            f"  // {_comment(rng, korean)}",
            f"  const {_ident(rng, camel=True)} = options.{_ident(rng, 1)} || {rng.randint(0, 100)};",
            f"  if (!{a}) {{",
            "    return null;",
            "  }",
            f"  return {a}.map((x) => x * {rng.randint(2, 9)}).filter((x) => x > {rng.randint(0, 50)});",
            "}",
            "",
        ]
    out.append(f"module.exports = {{ {_ident(rng, camel=True)} }};")
    return "\n".join(out) + "\n"


def c_code(rng: random.Random, korean: bool) -> str:
    out = [f"/* {_comment(rng, korean)} */", "#include <stdio.h>", "#include <stdlib.h>", ""]
    for _ in range(rng.randint(4, 30)):
        f, a = _ident(rng), _ident(rng, 1)
        out += [
            f"static int {f}(const int *{a}, size_t n)",
            "{",
            f"    /* {_comment(rng, korean)} */",
            "    int total = 0;",
            "    for (size_t i = 0; i < n; i++) {",
            f"        if ({a}[i] > {rng.randint(0, 99)})",
            f"            total += {a}[i] * {rng.randint(2, 9)};",
            "    }",
            "    return total;",
            "}",
            "",
        ]
    return "\n".join(out) + "\n"


def code(rng: random.Random) -> tuple[str, str]:
    lang = rng.choice(["python", "javascript", "c"])
    korean = rng.random() < 0.35
    return lang, {"python": python_code, "javascript": js_code, "c": c_code}[lang](rng, korean)


# --- instruction records: a task in English or Korean, a Python solution ---------------------

# (function name, English task, Korean task, example input, example output)
TASKS = [
    ("sum_even", "takes a list of integers and returns the sum of the even numbers",
     "정수 리스트를 받아 짝수의 합을 반환하는", "[1, 2, 3, 4]", "6"),
    ("count_words", "counts how many times each word appears in a string and returns a dictionary",
     "문자열에서 각 단어가 몇 번 나오는지 세어 딕셔너리로 반환하는", '"a b a"', "{'a': 2, 'b': 1}"),
    ("is_palindrome", "checks whether a string reads the same forwards and backwards, ignoring case",
     "대소문자를 무시하고 문자열이 회문인지 확인하는", '"Level"', "True"),
    ("max_subarray", "returns the largest sum of a contiguous subarray",
     "연속된 부분 배열의 최대 합을 반환하는", "[-2, 1, -3, 4, -1, 2, 1]", "6"),
    ("merge_sorted", "merges two sorted lists into one sorted list",
     "정렬된 두 리스트를 하나의 정렬된 리스트로 합치는", "[1, 3], [2, 4]", "[1, 2, 3, 4]"),
    ("unique_items", "removes duplicates from a list while keeping the original order",
     "원래 순서를 유지하면서 리스트의 중복을 제거하는", "[3, 1, 3, 2, 1]", "[3, 1, 2]"),
    ("fibonacci", "returns the n-th Fibonacci number",
     "n번째 피보나치 수를 반환하는", "10", "55"),
    ("binary_search", "finds the index of a target value in a sorted list, or -1 if it is missing",
     "정렬된 리스트에서 목표 값의 위치를 찾고 없으면 -1을 반환하는", "[1, 3, 5, 7], 5", "2"),
    ("transpose", "transposes a matrix given as a list of rows",
     "행의 리스트로 주어진 행렬을 전치하는", "[[1, 2], [3, 4]]", "[[1, 3], [2, 4]]"),
    ("gcd_list", "returns the greatest common divisor of all numbers in a list",
     "리스트에 있는 모든 수의 최대공약수를 반환하는", "[12, 18, 24]", "6"),
    ("top_k", "returns the k most frequent elements of a list",
     "리스트에서 가장 자주 나오는 원소 k개를 반환하는", "[1, 1, 2, 2, 2, 3], 2", "[2, 1]"),
    ("valid_brackets", "checks whether every bracket in a string is closed in the right order",
     "문자열의 괄호가 올바른 순서로 닫혔는지 확인하는", '"([]{})"', "True"),
    ("flatten", "flattens a nested list of any depth",
     "임의 깊이의 중첩 리스트를 평탄화하는", "[1, [2, [3]]]", "[1, 2, 3]"),
    ("rotate_list", "rotates a list to the right by k steps",
     "리스트를 오른쪽으로 k칸 회전하는", "[1, 2, 3, 4, 5], 2", "[4, 5, 1, 2, 3]"),
    ("prime_factors", "returns the prime factors of a positive integer in increasing order",
     "양의 정수의 소인수를 오름차순으로 반환하는", "60", "[2, 2, 3, 5]"),
    ("average_score", "computes the average of the scores in a dictionary of student names to scores",
     "학생 이름과 점수의 딕셔너리에서 평균 점수를 계산하는", '{"kim": 90, "lee": 80}', "85.0"),
]  # fmt: skip

EN_INSTRUCTIONS = [
    "Write a Python function `{f}` that {task}.",
    "Implement `{f}` in Python: a function that {task}.",
    "You are given the following problem. Write a function named {f} that {task}. "
    "Make sure your solution handles empty input.",
    "Create a Python function called {f} which {task}. Your function should be efficient.",
    "Given a problem description, write code. The function {f} {task}.",
]
KO_INSTRUCTIONS = [
    "{task} 파이썬 함수 `{f}`를 작성하세요.",
    "다음 문제를 해결하는 함수 {f}를 구현하세요. 이 함수는 {task} 함수입니다.",
    "{task} 함수 `{f}`를 만들어 주세요. 빈 입력도 처리해야 합니다.",
    "파이썬으로 {task} 함수를 작성하고 이름은 {f}로 하세요.",
]
EN_EXPLAIN = [
    "The function walks through the input once, so it runs in O(n) time.",
    "This solution uses a dictionary to keep track of the counts.",
    "We handle the empty case first and then process each element in turn.",
    "The time complexity is O(n log n) because of the sort, and the extra space is O(n).",
    "Each step keeps the invariant described above, which makes the result correct.",
]
KO_EXPLAIN = [
    "이 함수는 입력을 한 번만 순회하므로 시간 복잡도는 O(n)입니다.",
    "딕셔너리를 사용해 각 원소의 개수를 기록합니다.",
    "먼저 빈 입력을 처리한 다음 각 원소를 차례로 확인합니다.",
    "정렬 때문에 시간 복잡도는 O(n log n)이고 추가 공간은 O(n)입니다.",
    "반복문을 돌면서 조건을 만족하는 값만 결과에 더합니다.",
]


def _solution_body(rng: random.Random, f: str, korean: bool) -> list[str]:
    a, b = _ident(rng, 1), _ident(rng, 1)
    shape = rng.randrange(6)
    comment = f"    # {_comment(rng, korean)}"
    if shape == 0:  # a one-liner: short records are what prose word counts drop
        return [f"def {f}({a}s):", f"    return [{a} for {a} in {a}s if {a} % 2 == 0]"]
    if shape == 1:
        return [
            f"def {f}({a}s):",
            comment,
            "    result = {}",
            f"    for {a} in {a}s:",
            f"        result[{a}] = result.get({a}, 0) + 1",
            "    return result",
        ]
    if shape == 2:  # stdin / stdout, as competitive programming solutions are written
        return [
            "import sys",
            "",
            "",
            "def main():",
            "    data = sys.stdin.read().split()",
            "    n = int(data[0])",
            "    values = list(map(int, data[1:n + 1]))",
            "    total = 0",
            "    for v in values:",
            "        if v % 2 == 0:",
            "            total += v",
            "    print(total)",
            "",
            "",
            'if __name__ == "__main__":',
            "    main()",
        ]
    if shape == 3:  # a docstring with parameters, as instruction datasets write them
        return [
            f"def {f}({a}, {b}=None):", '    """', f"    {_comment(rng, korean).capitalize()}.", "",
            f"    :param {a}: the input values", f"    :param {b}: optional settings", "    :return: the result",
            '    """', f"    if not {a}:", "        return []", f"    {b} = {b} or {{}}", "    out = []",
            f"    for i, x in enumerate({a}):", "        if x not in out:", "            out.append(x)",
            "    return out",
        ]  # fmt: skip
    if shape == 4:  # a class
        return [
            f"class {f.title().replace('_', '')}:",
            "    def __init__(self):",
            "        self.items = []",
            "",
            "    def add(self, item):",
            "        self.items.append(item)",
            "",
            "    def total(self):",
            "        return sum(self.items)",
            "",
            "    def __len__(self):",
            "        return len(self.items)",
        ]
    lo, hi = _ident(rng, 1), _ident(rng, 1)
    return [  # a loop with repeated lines (what prose repetition rules count)
        f"def {f}({a}s, target):",
        f"    {lo}, {hi} = 0, len({a}s) - 1",
        f"    while {lo} <= {hi}:",
        f"        mid = ({lo} + {hi}) // 2",
        f"        if {a}s[mid] == target:",
        "            return mid",
        f"        if {a}s[mid] < target:",
        f"            {lo} = mid + 1",
        "        else:",
        f"            {hi} = mid - 1",
        "    return -1",
    ]


def instruction_record(rng: random.Random, task: str | None = None) -> tuple[str, str]:
    """(layout, text): an instruction in English or Korean (or `task`, in English) and a Python
    solution, laid out as instruction datasets are when their fields are joined (`text_template`)."""
    korean = task is None and rng.random() < 0.4
    f, task_en, task_ko, example_in, example_out = rng.choice(TASKS)
    if task is not None:
        instruction, example = task, f"Input: {example_in}\nOutput: {example_out}"
        explain = rng.sample(EN_EXPLAIN, rng.randint(1, 2))
    elif korean:
        instruction = rng.choice(KO_INSTRUCTIONS).format(f=f, task=task_ko)
        example = f"입력: {example_in}\n출력: {example_out}"
        explain = rng.sample(KO_EXPLAIN, rng.randint(1, 2))
    else:
        instruction = rng.choice(EN_INSTRUCTIONS).format(f=f, task=task_en)
        example = f"Input: {example_in}\nOutput: {example_out}"
        explain = rng.sample(EN_EXPLAIN, rng.randint(1, 2))
    if rng.random() < 0.5:
        instruction += "\n\n" + (("예시:\n" if korean else "Example:\n") + example)
    code_lines = _solution_body(rng, f, korean)
    if rng.random() < 0.4:
        code_lines += ["", "", f"print({f}({example_in}))  # {example_out}"]
    solution = "\n".join(code_lines)
    layout = rng.choice(["plain", "fenced", "fenced_explained", "alpaca", "qa"])
    if layout == "plain":
        text = f"{instruction}\n{solution}"
    elif layout == "fenced":
        text = f"{instruction}\n\n```python\n{solution}\n```"
    elif layout == "fenced_explained":
        text = f"{instruction}\n\n```python\n{solution}\n```\n\n{' '.join(explain)}"
    elif layout == "alpaca":
        text = f"### Instruction:\n{instruction}\n\n### Response:\n```python\n{solution}\n```"
    else:
        q, ans = ("질문", "답변") if korean else ("Question", "Answer")
        text = f"{q}: {instruction}\n{ans}:\n{solution}\n{' '.join(explain)}"
    return layout, text + "\n"


# --- other languages --------------------------------------------------------------------------

OTHER = {
    "ja": [
        "今日は朝から雨が降っていたので、駅まで歩いて行くのをやめてバスに乗りました。",
        "この町には古い寺がたくさんあり、毎年多くの観光客が訪れます。",
        "彼女は大学で経済学を勉強した後、東京の銀行に就職しました。",
        "新しい図書館は駅のすぐ近くにあって、夜九時まで開いています。",
        "週末には家族と一緒に近くの公園へ散歩に行くことが多いです。",
        "会議の資料は明日の午前中までに全員に送ってください。",
        "この料理は母がよく作ってくれたもので、今でも時々思い出します。",
        "電車が遅れたため、約束の時間に少し遅れてしまいました。",
        "日本の夏は湿度が高く、夜になってもなかなか涼しくなりません。",
        "子どもたちは先生の話を聞きながら、熱心にノートを取っていました。",
        "このソフトウェアの新しい版では、検索の速さが大きく改善されました。",
        "山の上から見た景色はとても美しく、疲れを忘れるほどでした。",
        "祖父は若い頃、小さな港町で漁師として働いていたそうです。",
        "研究チームは三年間の調査の結果を来月の学会で発表する予定です。",
        "冬になると、この地域では雪が一メートル以上積もることもあります。",
    ],
    "zh": [
        "今天早上天气很好，我们决定去公园散步。",
        "这座城市有很多历史悠久的建筑，每年吸引大量游客。",
        "他在大学学习计算机科学，毕业后在一家软件公司工作。",
        "新的图书馆就在地铁站旁边，晚上九点才关门。",
        "周末我常常和家人一起去附近的市场买新鲜的蔬菜。",
        "请在明天中午之前把会议的材料发给所有人。",
        "这道菜是我奶奶经常做的，现在想起来还觉得很温暖。",
        "因为火车晚点，我们比原计划晚了一个小时到达。",
        "夏天这里非常潮湿，晚上也不太凉快。",
        "孩子们一边听老师讲课，一边认真地做笔记。",
        "研究人员花了三年时间收集数据，并将在下个月公布结果。",
        "从山顶看下去，整个城市的风景都尽收眼底。",
        "这个软件的新版本大大提高了搜索的速度。",
        "爷爷年轻的时候在一个小渔村当渔民。",
        "冬天这个地区经常下大雪，有时候积雪超过一米。",
    ],
    "de": [
        "Am Morgen regnete es so stark, dass wir den Ausflug in die Berge verschieben mussten.",
        "Die Stadt hat in den letzten Jahren viel Geld in den Ausbau der Radwege investiert.",
        "Nach dem Studium arbeitete sie mehrere Jahre als Ingenieurin in einem kleinen Unternehmen.",
        "Die neue Bibliothek liegt direkt am Bahnhof und ist bis zweiundzwanzig Uhr geöffnet.",
        "Am Wochenende gehen wir oft mit den Kindern im Wald spazieren.",
        "Bitte schicken Sie mir die Unterlagen bis spätestens Freitag zu.",
        "Das Rezept stammt von meiner Großmutter, die es jedes Jahr zu Weihnachten gekocht hat.",
        "Wegen eines technischen Problems fiel der Zug zwischen Köln und Bonn aus.",
        "Viele Bürger haben sich bei der Versammlung gegen den Bau der neuen Straße ausgesprochen.",
        "Die Forscher wollen die Ergebnisse ihrer Untersuchung im nächsten Monat veröffentlichen.",
        "Im Sommer ist es hier oft sehr heiß, aber die Nächte bleiben angenehm kühl.",
        "Der Verein sucht noch freiwillige Helfer für das Stadtfest im August.",
        "Mein Großvater hat sein ganzes Leben in diesem kleinen Dorf an der Küste verbracht.",
        "Die Software wurde grundlegend überarbeitet und ist jetzt deutlich schneller.",
        "Im Winter fällt in dieser Gegend manchmal mehr als ein Meter Schnee.",
    ],
    "fr": [
        "Ce matin, il pleuvait tellement que nous avons décidé de rester à la maison.",
        "La ville a beaucoup investi ces dernières années dans les transports en commun.",
        "Après ses études, elle a travaillé pendant cinq ans dans une petite entreprise à Lyon.",
        "La nouvelle bibliothèque se trouve juste à côté de la gare et ferme à vingt-deux heures.",
        "Le week-end, nous allons souvent nous promener au bord de la rivière avec les enfants.",
        "Merci de m'envoyer les documents avant vendredi midi au plus tard.",
        "Cette recette vient de ma grand-mère, qui la préparait chaque année pour Noël.",
        "À cause d'une panne, le train entre Paris et Rouen a été supprimé.",
        "De nombreux habitants se sont opposés au projet lors de la réunion publique.",
        "Les chercheurs publieront les résultats de leur étude le mois prochain.",
        "En été, il fait très chaud dans la région, mais les nuits restent fraîches.",
        "L'association cherche encore des bénévoles pour la fête du village en août.",
        "Mon grand-père a passé toute sa vie dans ce petit port de pêche.",
        "La nouvelle version du logiciel est beaucoup plus rapide que la précédente.",
        "En hiver, la neige peut dépasser un mètre dans les villages de montagne.",
    ],
    "es": [
        "Esta mañana llovía tanto que decidimos quedarnos en casa todo el día.",
        "La ciudad ha invertido mucho dinero en ampliar la red de carriles para bicicletas.",
        "Después de terminar la carrera, trabajó varios años como ingeniera en Valencia.",
        "La nueva biblioteca está justo al lado de la estación y cierra a las diez de la noche.",
        "Los fines de semana solemos pasear por el parque con nuestros hijos.",
        "Por favor, envíeme los documentos antes del viernes al mediodía.",
        "Esta receta es de mi abuela, que la preparaba todos los años en Navidad.",
        "Debido a una avería, el tren entre Madrid y Toledo fue cancelado.",
        "Muchos vecinos se opusieron al proyecto durante la reunión del ayuntamiento.",
        "Los investigadores publicarán los resultados de su estudio el próximo mes.",
        "En verano hace mucho calor en esta región, pero las noches son frescas.",
        "La asociación todavía busca voluntarios para la fiesta del pueblo en agosto.",
        "Mi abuelo pasó toda su vida en este pequeño pueblo de pescadores.",
        "La nueva versión del programa es mucho más rápida que la anterior.",
        "En invierno, la nieve puede superar el metro de altura en las montañas.",
    ],
    "ru": [
        "Сегодня утром шёл такой сильный дождь, что мы решили остаться дома.",
        "За последние годы город вложил много денег в развитие общественного транспорта.",
        "После окончания университета она несколько лет работала инженером в Казани.",
        "Новая библиотека находится рядом с вокзалом и работает до десяти часов вечера.",
        "По выходным мы часто гуляем с детьми в парке у реки.",
        "Пожалуйста, пришлите мне документы не позднее пятницы.",
        "Этот рецепт достался мне от бабушки, которая готовила его каждый Новый год.",
        "Из-за технической неисправности поезд между Москвой и Тверью был отменён.",
        "Многие жители выступили против строительства новой дороги на собрании.",
        "Исследователи опубликуют результаты своей работы в следующем месяце.",
        "Летом здесь очень жарко, но ночи остаются прохладными.",
        "Общество всё ещё ищет добровольцев для городского праздника в августе.",
        "Мой дедушка всю жизнь прожил в этой маленькой рыбацкой деревне.",
        "Новая версия программы работает гораздо быстрее прежней.",
        "Зимой в этих горах выпадает больше метра снега.",
    ],
}


def other_language(rng: random.Random) -> tuple[str, str]:
    """5–12 distinct sentences of one language's bank in a random order (a sentence repeated inside
    a document would make it fail the quality rules' repetition checks before language ID)."""
    lang = rng.choice(sorted(OTHER))
    sentences = rng.sample(OTHER[lang], rng.randint(5, min(12, len(OTHER[lang]))))
    sep = "" if lang in ("ja", "zh") else " "
    cuts = sorted(rng.sample(range(1, len(sentences)), rng.randint(0, 2)))
    paragraphs = [sep.join(sentences[a:b]) for a, b in zip([0, *cuts], [*cuts, len(sentences)], strict=True)]
    return lang, "\n\n".join(paragraphs) + "\n"


# --- low quality ------------------------------------------------------------------------------

SPAM = """
    cheap best deal discount free shipping buy now sale offer lowest price online shop top rated
    hotel flights car insurance loans casino bonus win prize download crack full version coupon
""".split()
MENU = """
    Home About Contact Login Register Products Services Blog News FAQ Support Careers Privacy Terms
    Sitemap Cart Checkout Account Help Search Shop Deals Gallery Events Team Partners Press Downloads
""".split()
LOREM = """
    lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore
    et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris nisi aliquip
    ex ea commodo consequat duis aute irure in reprehenderit voluptate velit esse cillum fugiat nulla
""".split()
SYMBOLS = "!@#$%^&*()_+-=[]{}|;:,.<>?/~`§±¶•★☆■□▲△●○◆◇※→←↑↓"


def low_quality(rng: random.Random) -> tuple[str, str]:
    sub = rng.choice(["spam", "menu", "lorem", "repeated", "symbols"])
    if sub == "spam":
        text = " ".join(rng.choice(SPAM) for _ in range(rng.randint(80, 400)))
    elif sub == "menu":
        lines = [" | ".join(rng.sample(MENU, rng.randint(4, 9))) for _ in range(rng.randint(10, 40))]
        text = "\n".join(lines)
    elif sub == "lorem":
        words = [rng.choice(LOREM) for _ in range(rng.randint(100, 600))]
        text = "Lorem ipsum " + " ".join(words) + "."
    elif sub == "repeated":
        line = en_sentence(rng) if rng.random() < 0.5 else ko_sentence(rng)
        text = "\n".join([line] * rng.randint(20, 80))
    else:
        lines = ["".join(rng.choice(SYMBOLS) for _ in range(rng.randint(20, 80))) for _ in range(rng.randint(10, 50))]
        text = "\n".join(lines)
    return sub, text + "\n"


# --- evaluation items -------------------------------------------------------------------------

EVAL_TEMPLATES_EN = [
    "Which of the following best explains why the {adj} {noun} in {place} {verb_past} the {noun} "
    "after the {noun} of {year} and what effect did it have on the {adj} {noun}",
    "A {noun} has {number} {noun}s and each {noun} {verb_past} {number} {noun}s during the {season} "
    "how many {noun}s did the {adj} {noun} {verb} in total",
    "According to the passage what was the main reason that {name} {verb_past} the {adj} {noun} "
    "instead of the {adj} {noun} near {place}",
    "If the {noun} had not {verb_past} the {noun} in {year} which {noun} would most likely have "
    "{verb_past} the {adj} {noun} of {place} first",
    "What is the most {adj} way to {verb} a {noun} when the {noun} is {adj} and the {noun} cannot "
    "{verb} the {adj} {noun} before the {noun}",
]


def eval_item(rng: random.Random, korean: bool) -> str:
    while True:
        if korean:
            words = " ".join(ko_sentence(rng).rstrip(".") for _ in range(3)).split()
            words = words[: rng.randint(15, 40)]
            q = " ".join(words) + " 이유는 무엇인가"
        else:
            q = _fill(rng, rng.choice(EVAL_TEMPLATES_EN), EN | EN_EXTRA) + "?"
            q = q[0].upper() + q[1:]
        n = len(q.split())
        if 15 <= n <= 40:
            return q


def disguise(rng: random.Random, question: str) -> str:
    """The question as it might be copied into a web page: case and punctuation changed."""
    words = question.split()
    style = rng.randrange(4)
    if style == 0:
        words = [w.upper() for w in words]
    elif style == 1:
        words = [w.capitalize() for w in words]
    elif style == 2:
        words = [w.lower() for w in words]
    comma = rng.randrange(len(words) - 1)  # at least one punctuation change, also in Korean
    text = " ".join(w + ("," if i == comma or rng.random() < 0.1 else "") for i, w in enumerate(words))
    text = text.rstrip("?") + rng.choice(["?", "??", ".", "", " ?", "!"])
    return rng.choice(["Q: ", "Question: ", '"', "", "1) "]) + text + rng.choice(["", '"', " (answer below)"])


CODE_EVAL_TEMPLATES = [
    "Write a python function to {verb} the {adj} {noun} of a given list of {noun}s and return the {noun} "
    "whose {noun} is more {adj} than {number}",
    "Given a list of {noun} records each with a {noun} and a {noun} return the {number} most {adj} {noun}s "
    "sorted by their {noun} in descending order",
    "Write a function that takes a string describing a {noun} in {place} and returns the number of {adj} "
    "{noun}s it mentions before the first {noun}",
    "Implement a function that checks whether a {adj} {noun} can {verb} every {noun} in a list of {noun}s "
    "within {number} {unit} and returns True or False",
]


def code_eval_item(rng: random.Random) -> str:
    """A coding task as code benchmarks state them (MBPP, HumanEval docstrings), 15–40 words."""
    while True:
        q = _fill(rng, rng.choice(CODE_EVAL_TEMPLATES), EN | EN_EXTRA) + "."
        if 15 <= len(q.split()) <= 40:
            return q


def planted_in_code(rng: random.Random, task: str) -> tuple[str, str]:
    """(where, text): an instruction record with the evaluation task in it, as the instruction
    (case and punctuation changed), as the solution's docstring, or as comments above the code
    (wrapped over several lines)."""
    where = rng.choice(["instruction", "docstring", "comment"])
    if where == "instruction":
        return where, instruction_record(rng, disguise(rng, task))[1]
    f = rng.choice(TASKS)[0]
    lines = textwrap.wrap(task, rng.randint(40, 80))
    body = _solution_body(rng, f, korean=False)
    if where == "docstring":
        body = [body[0], '    """', *(f"    {line}" for line in lines), '    """', *body[1:]]
    else:
        body = [*(f"# {line}" for line in lines), *body]
    intro = rng.choice(["Complete the function below.", "다음 함수를 완성하세요.", "Fix the bug in this code:"])
    return where, f"{intro}\n\n```python\n" + "\n".join(body) + "\n```\n"


def planted(rng: random.Random, question: str, korean: bool) -> str:
    host = ko_prose(rng) if korean else en_prose(rng)
    paragraphs = host.split("\n\n")
    at = rng.randint(1, max(1, len(paragraphs) - 1))
    line = disguise(rng, question)
    if rng.random() < 0.5:  # inside a paragraph, between two sentences
        para = paragraphs[at - 1]
        cut = para.find(". ") + 1 or len(para)
        paragraphs[at - 1] = para[:cut] + " " + line + " " + para[cut:].lstrip()
    else:
        paragraphs.insert(at, line)
    return "\n\n".join(paragraphs)


# --- copies -----------------------------------------------------------------------------------

_FULL_WIDTH = {c: chr(ord(c) + 0xFEE0) for c in map(chr, range(0x21, 0x7F))}


def exact_copy(rng: random.Random, text: str) -> tuple[str, str]:
    """(variant, copy): identical, or only whitespace / NFKC-equivalent characters changed."""
    variant = rng.choice(["identical", "whitespace", "nfkc"])
    if variant == "whitespace":
        parts = text.split(" ")
        for i in rng.sample(range(len(parts)), min(len(parts), rng.randint(1, 12))):
            parts[i] += rng.choice([" ", "  ", "\t", "\n"])
        copy = " ".join(parts)
        copy = copy.replace("\n\n", "\n\n\n", 1) + rng.choice(["", "  ", "\n\n"])
        copy = rng.choice(["", " ", "\n"]) + copy
    elif variant == "nfkc":
        lo = rng.randrange(max(1, len(text) - 200))
        span = text[lo : lo + rng.randint(50, 200)]
        if any("가" <= ch <= "힣" for ch in span) and rng.random() < 0.5:
            changed = unicodedata.normalize("NFD", span)  # conjoining jamo: NFKC composes them back
        else:
            changed = "".join(_FULL_WIDTH.get(ch, ch) for ch in span)
        copy = text[:lo] + changed + text[lo + len(span) :]
    else:
        copy = text
    if variant != "identical" and copy == text:
        copy = text + " "
    return variant, copy


def near_copy(rng: random.Random, text: str, vocab: list[str]) -> tuple[str, float, str]:
    """(mode, copy, fraction of words changed): 1–6% of the words replaced, inserted or deleted,
    at scattered places or in one run (a sentence rewritten)."""
    pieces = re.split(r"(\s+)", text)
    word_at = [i for i, p in enumerate(pieces) if p and not p.isspace()]
    fraction = rng.uniform(0.01, 0.06)
    k = max(1, round(fraction * len(word_at)))
    mode = rng.choice(["scattered", "scattered", "run"])
    if mode == "run":
        start = rng.randrange(max(1, len(word_at) - k))
        targets = word_at[start : start + k]
    else:
        targets = rng.sample(word_at, min(k, len(word_at)))
    for i in targets:
        op = rng.random()
        new = rng.choice(vocab)
        if op < 0.7:
            pieces[i] = new
        elif op < 0.85:
            pieces[i] = pieces[i] + " " + new
        else:
            pieces[i] = ""
    return mode, "".join(pieces), fraction


# --- the corpus -------------------------------------------------------------------------------


@dataclass
class Corpus:
    data: Path  # jsonl, {"text": ...} a line
    evals: Path  # jsonl, {"id": ..., "question": ...} a line
    truth: Path  # json: {"docs": [one entry a line of data], "counts": {kind: n}}
    docs: list[dict]  # the entries of truth.json: kind, and original/jaccard/eval_id/... by kind
    texts: list[str]


def _counts(num_docs: int, mix: str) -> dict[str, int]:
    shares = MIXES[mix]
    counts = {k: round(v * num_docs) for k, v in shares.items()}
    counts["en"] += num_docs - sum(counts.values())
    return {k: counts.get(k, 0) for k in KINDS}


KINDS = ("en", "ko", "code", "instruct", "other", "low", "planted", "planted_code", "exact_dup", "near_dup")
CODE_KINDS = ("code", "instruct", "planted_code")  # what the cleaning stages must keep as code


def generate(out_dir: str | Path, num_docs: int, *, seed: int = 0, mix: str = "mixed") -> Corpus:
    """Write the corpus (see the module docstring) into `out_dir` and return it."""
    from moai.clean.shingles import shingle_set

    rng = random.Random(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = _counts(num_docs, mix)
    # Originals first in a shuffled order of kinds; copies are then inserted after their original.
    kinds = [k for k in ("en", "ko", "code", "other", "low", "planted") for _ in range(counts[k])]
    kinds += [k for k in ("instruct", "planted_code") for _ in range(counts[k])]  # 0 in mixes before "code"
    rng.shuffle(kinds)
    evals: list[dict] = []
    base: list[tuple[str, dict]] = []
    for kind in kinds:
        if kind == "en":
            base.append((en_prose(rng), {"kind": "en"}))
        elif kind == "ko":
            base.append((ko_prose(rng), {"kind": "ko"}))
        elif kind == "code":
            lang, text = code(rng)
            base.append((text, {"kind": "code", "lang": lang}))
        elif kind == "other":
            lang, text = other_language(rng)
            base.append((text, {"kind": "other", "lang": lang}))
        elif kind == "low":
            sub, text = low_quality(rng)
            base.append((text, {"kind": "low", "sub": sub}))
        elif kind == "instruct":
            layout, text = instruction_record(rng)
            base.append((text, {"kind": "instruct", "layout": layout}))
        elif kind == "planted":
            korean = rng.random() < 0.3
            item = {"id": f"eval-{len(evals):05d}", "question": eval_item(rng, korean)}
            evals.append(item)
            base.append((planted(rng, item["question"], korean), {"kind": "planted", "eval_id": item["id"]}))
        else:
            item = {"id": f"eval-{len(evals):05d}", "question": code_eval_item(rng)}
            evals.append(item)
            where, text = planted_in_code(rng, item["question"])
            base.append((text, {"kind": "planted_code", "eval_id": item["id"], "where": where}))
    for _ in range(4 * counts["planted"]):  # items nobody copied
        evals.append({"id": f"eval-{len(evals):05d}", "question": eval_item(rng, rng.random() < 0.3)})
    for _ in range(4 * counts["planted_code"]):
        evals.append({"id": f"eval-{len(evals):05d}", "question": code_eval_item(rng)})
    rng.shuffle(evals)

    # Copies: each goes at a random place after its original (in the final order of base documents).
    copyable = [i for i, (_, t) in enumerate(base) if t["kind"] in ("en", "ko", "code", "instruct")]
    vocab = {
        "en": EN["noun"] + EN["adj"] + EN["verb_past"],
        "ko": [_p(w, "을", "를") for w in KO["thing"]] + KO["adv"] + KO["adj"],
        "code": IDENT,
        "instruct": IDENT,
    }
    after: dict[int, list[tuple[str, dict]]] = {}
    for kind in ["exact_dup"] * counts["exact_dup"] + ["near_dup"] * counts["near_dup"]:
        src = rng.choice(copyable)
        text, t = base[src]
        if kind == "exact_dup":
            variant, copy = exact_copy(rng, text)
            entry = {"kind": kind, "of": src, "variant": variant}
        else:
            a = shingle_set(text, NGRAM)
            while True:
                mode, copy, fraction = near_copy(rng, text, vocab[t["kind"]])
                b = shingle_set(copy, NGRAM)
                jac = len(a & b) / len(a | b)
                if jac < 1.0:
                    break
            entry = {"kind": kind, "of": src, "jaccard": round(jac, 6), "changed": round(fraction, 4), "mode": mode}
        at = rng.randint(src, len(base) - 1)
        after.setdefault(at, []).append((copy, entry))

    texts: list[str] = []
    docs: list[dict] = []
    line_of: dict[int, int] = {}
    for i, (text, entry) in enumerate(base):
        line_of[i] = len(texts)
        texts.append(text)
        docs.append(entry)
        for copy, e in after.get(i, []):
            e = dict(e)
            e["original"] = line_of[e.pop("of")]
            texts.append(copy)
            docs.append(e)

    data = out / "data.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    evals_path = out / "evals.jsonl"
    with open(evals_path, "w", encoding="utf-8") as f:
        for item in evals:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    truth = out / "truth.json"
    summary = dict(Counter(d["kind"] for d in docs))
    truth.write_text(json.dumps({"seed": seed, "mix": mix, "counts": summary, "docs": docs}, ensure_ascii=False))
    return Corpus(data, evals_path, truth, docs, texts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", choices=sorted(MIXES), default="mixed")
    args = ap.parse_args()
    corpus = generate(args.out_dir, args.docs, seed=args.seed, mix=args.mix)
    near = [d["jaccard"] for d in corpus.docs if d["kind"] == "near_dup"]
    print(
        json.dumps(
            {
                "data": str(corpus.data),
                "evals": str(corpus.evals),
                "truth": str(corpus.truth),
                "documents": len(corpus.docs),
                "mb": round(corpus.data.stat().st_size / 1e6, 1),
                "kinds": dict(Counter(d["kind"] for d in corpus.docs)),
                "near_dup_jaccard_ge_0.8": sum(j >= 0.8 for j in near),
            }
        ),
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()
