"""Word segmentation by script and document scripts on realistic samples.

The samples here (prose in Korean, English and both; code in a dozen languages) are also the
inputs of test_code.py, test_quality.py and test_language.py. A paragraph is one line, as in web text, so
lines are longer than the limit.
"""

# ruff: noqa: E501

from __future__ import annotations

import pytest

from moai.clean.words import TextStats, script, words

# --- prose ------------------------------------------------------------------------------------

KO_NEWS = """\
서울시는 내년부터 시내버스 노선을 전면 개편한다고 23일 밝혔다. 이번 개편은 2004년 대중교통 체계 개편 이후 20년 만에 이뤄지는 최대 규모의 변화다. 시는 출퇴근 시간대 혼잡도가 높은 간선 노선의 배차 간격을 줄이고, 이용객이 적은 지선 노선은 통폐합할 계획이다.

시 관계자는 "신도시와 재개발 지역이 늘면서 기존 노선이 실제 이동 수요를 따라가지 못하고 있다"며 "빅데이터 분석을 통해 시민들이 실제로 많이 이동하는 경로를 중심으로 노선을 다시 짰다"고 설명했다. 시는 교통카드 이용 기록 약 3억 건을 분석해 정류장별 승하차 인원과 환승 패턴을 파악했다.

시민 단체들은 대체로 환영하는 분위기지만 일부 우려도 나온다. 통폐합 대상 노선이 지나는 지역의 주민들은 버스를 타러 더 먼 정류장까지 걸어가야 한다며 불만을 제기했다. 이에 대해 시는 마을버스 연계를 강화하고 수요응답형 버스를 시범 운행해 교통 공백을 최소화하겠다고 밝혔다.

개편안은 다음 달 공청회를 거쳐 확정되며, 새 노선은 내년 7월부터 단계적으로 적용된다. 시는 바뀐 노선 정보를 모바일 앱과 정류장 안내판을 통해 미리 알릴 예정이다.
"""

KO_BLOG = """\
지난 주말에 가족들과 함께 강원도 평창으로 짧은 여행을 다녀왔다. 서울에서 출발할 때는 하늘이 흐렸는데, 대관령을 넘어가자 거짓말처럼 구름이 걷히고 파란 하늘이 나타났다. 아이들은 창밖으로 보이는 풍력 발전기를 보고 신기하다며 한참을 떠들었다.

첫날에는 양떼목장에 들렀다. 입구에서 받은 건초를 양들에게 주는 체험이 있었는데, 처음에는 무서워하던 막내도 나중에는 양을 쓰다듬으며 즐거워했다. 목장 꼭대기까지 올라가는 산책로는 경사가 완만해서 어르신들도 어렵지 않게 걸을 수 있었다.

저녁에는 숙소 근처 식당에서 황태구이와 감자전을 먹었다. 강원도에서 나는 감자로 만든 전은 겉이 바삭하고 속은 쫀득해서 정말 맛있었다. 식사를 마치고 숙소로 돌아오는 길에 올려다본 밤하늘에는 도시에서는 볼 수 없던 별들이 가득했다.

다음 날 아침 일찍 일어나 월정사 전나무 숲길을 걸었다. 천 년 가까이 된 절로 이어지는 길 양옆으로 아름드리 전나무가 늘어서 있어서 공기가 무척 맑았다. 짧은 일정이었지만 오랜만에 가족이 함께 시간을 보낼 수 있어서 뜻깊은 여행이었다.
"""

KO_WIKI = """\
훈민정음은 조선의 제4대 임금인 세종이 1443년에 창제하여 1446년에 반포한 문자 체계이다. 오늘날에는 한글이라는 이름으로 널리 불린다. 훈민정음이라는 이름은 백성을 가르치는 바른 소리라는 뜻을 담고 있다.

창제 당시 조선에서는 한자를 빌려 쓰는 이두와 구결이 사용되었으나, 한자를 익히기 어려운 일반 백성은 글을 읽고 쓰기가 매우 힘들었다. 세종은 이러한 문제를 해결하기 위해 누구나 쉽게 배울 수 있는 새로운 문자를 만들었다.

훈민정음의 자음은 발음 기관의 모양을 본떠 만들었고, 모음은 하늘과 땅과 사람을 상징하는 세 가지 기본 글자를 조합하여 만들었다. 이처럼 체계적인 원리에 따라 만들어진 문자는 세계적으로도 드물기 때문에 많은 언어학자들이 한글의 과학성을 높이 평가한다.

훈민정음 해례본은 1997년 유네스코 세계기록유산으로 등재되었다. 대한민국에서는 훈민정음 반포를 기념하여 매년 10월 9일을 한글날로 정하고 있다.
"""

EN_NEWS = """\
The city council voted on Tuesday to expand the network of protected bike lanes by forty miles over the next three years, a plan that supporters say will make cycling safer for commuters and opponents fear will worsen traffic on already crowded streets.

The proposal, which passed by a vote of seven to two, will add physical barriers between cars and bicycles on several major avenues. City engineers estimate that the first phase of construction will begin in the spring and that most of the work will be done at night to limit disruption.

"We have seen what happens when people feel safe on a bike," said the council member who introduced the measure. "They ride more, they drive less, and the whole city benefits from cleaner air and quieter streets." She pointed to data showing that cycling trips doubled on streets where protected lanes were built last year.

Business owners along the affected routes were divided. Some welcomed the prospect of more foot and bike traffic, while others worried that the loss of parking spaces would keep customers away. The council agreed to review the effects on local businesses after the first year and to adjust the plan if needed.
"""

EN_ESSAY = """\
There is a particular kind of quiet that settles over a library in the late afternoon. The students who arrived in the morning have gone home, the evening crowd has not yet come, and the only sounds are the soft turning of pages and the occasional creak of a chair. It is in this quiet that I have done most of my best thinking.

I did not always appreciate it. As a child I found libraries intimidating, full of rules I did not understand and books that seemed written for someone much older than me. It was only when a patient librarian showed me how to find books on the subjects I cared about that the building stopped feeling like a test and started feeling like a gift.

Years later, I still think about that librarian. She never lectured me about the value of reading. Instead, she asked what I was curious about and then helped me follow that curiosity wherever it led. That lesson, that learning works best when it begins with a question, has stayed with me far longer than anything I read in those early years.
"""

EN_WRAPPED = """\
It was the best of times, it was the worst of times, it was the age of
wisdom, it was the age of foolishness, it was the epoch of belief, it was
the epoch of incredulity, it was the season of Light, it was the season of
Darkness, it was the spring of hope, it was the winter of despair, we had
everything before us, we had nothing before us, we were all going direct to
Heaven, we were all going direct the other way. In short, the period was so
far like the present period, that some of its noisiest authorities insisted
on its being received, for good or for evil, in the superlative degree of
comparison only.

There were a king with a large jaw and a queen with a plain face, on the
throne of England; there were a king with a large jaw and a queen with a
fair face, on the throne of France. In both countries it was clearer than
crystal to the lords of the State preserves of loaves and fishes, that
things in general were settled for ever.
"""

EN_INLINE_CODE = """\
When you install the package, the command line tool is added to your path. Run moai --help to see the commands it offers, or open the README for a longer tour. Most people start with the prepare command, which reads the config file and builds every stage up to packing.

The config file is plain YAML. Its most important setting is the list of sources, where each entry names a path and the field that holds the text. If your data lives in Parquet files with a column called body, set text_field to body and the converter will read it for you.

Training is a separate step. Once the data is prepared, the train command reads the packed windows and writes checkpoints to the output folder. You can stop it at any time with Ctrl+C; the next run picks up from the last checkpoint without repeating any work.
"""

EN_ARTICLE_WITH_SNIPPET = """\
Python's standard library includes a module for working with dates and times, and most programs that deal with schedules, logs or reports end up using it. The module is powerful, but its many classes can be confusing at first, so it helps to start with the two that matter most: the date class and the datetime class.

A date holds a year, a month and a day, while a datetime adds hours, minutes, seconds and optionally a time zone. Both can be compared, sorted and subtracted, and subtracting one from another gives you a timedelta that measures the gap between them. The following short example prints the number of days until the end of the year.

    from datetime import date
    today = date.today()
    print((date(today.year, 12, 31) - today).days)

Time zones are where most of the trouble begins. A datetime without a time zone is called naive, and comparing it with one that has a time zone raises an error. The safest habit is to store every timestamp in UTC and to convert to local time only when you show it to a person. That way the arithmetic stays simple and daylight saving changes never shift your data by an hour.

If you need to parse dates written by people, such as "next Tuesday" or "3 days ago", the standard library will not help you, and a third-party package is the usual answer. For machine-written formats like ISO 8601, however, the built-in parser is fast and reliable, and it should be your first choice.
"""

KO_TECH_MIXED = """\
최근 대규모 언어 모델(LLM)을 직접 학습하려는 기업이 늘고 있다. 공개된 모델을 그대로 쓰는 것만으로는 한국어 성능이나 특정 분야의 전문성이 부족한 경우가 많기 때문이다. 하지만 모델을 처음부터 학습하려면 GPU 자원뿐 아니라 잘 정제된 데이터가 반드시 필요하다.

데이터 정제 과정에서 가장 먼저 하는 일은 중복 문서를 제거하는 것이다. 웹에서 수집한 데이터에는 같은 기사나 게시글이 여러 사이트에 복사되어 있는 경우가 흔하다. 이런 중복은 MinHash 같은 기법으로 찾아낼 수 있으며, 중복을 제거하면 학습 효율이 눈에 띄게 좋아진다.

다음으로는 품질이 낮은 문서를 걸러낸다. 광고 문구만 나열된 페이지나 메뉴 목록처럼 문장이 거의 없는 문서는 모델 학습에 도움이 되지 않는다. 영어 데이터에서 쓰이던 규칙을 한국어에 그대로 적용하면 멀쩡한 문서까지 버려질 수 있으므로, 한국어의 어절 구조에 맞게 규칙을 조정해야 한다.

마지막으로 언어 식별 모델을 이용해 원하는 언어의 문서만 남긴다. fastText 기반의 식별 모델은 속도가 빠르고 한국어도 잘 구분하기 때문에 많은 프로젝트에서 사용되고 있다.
"""

KO_WITH_SNIPPET = """\
파이썬에서 파일을 읽을 때는 with 문을 사용하는 것이 좋다. with 문을 사용하면 블록이 끝날 때 파일이 자동으로 닫히기 때문에, 예외가 발생하더라도 파일이 열린 채로 남는 문제를 막을 수 있다. 특히 여러 파일을 동시에 다루는 프로그램에서는 이런 습관이 큰 차이를 만든다.

아래는 텍스트 파일의 줄 수를 세는 간단한 예제이다.

    with open("data.txt", encoding="utf-8") as f:
        print(sum(1 for _ in f))

한글이 들어 있는 파일을 읽을 때는 인코딩을 반드시 지정해야 한다. 윈도우에서 만든 오래된 파일은 UTF-8이 아니라 CP949로 저장되어 있는 경우가 많기 때문에, 인코딩을 지정하지 않으면 글자가 깨지거나 오류가 발생할 수 있다. 인코딩을 모를 때는 먼저 UTF-8로 열어 보고, 오류가 나면 CP949로 다시 시도하는 방법을 많이 쓴다.

대용량 파일을 다룰 때는 파일 전체를 한 번에 메모리에 올리지 말고 한 줄씩 읽어 처리하는 것이 안전하다. 이렇게 하면 파일의 크기와 상관없이 일정한 메모리만 사용하게 된다.
"""

EN_MARKDOWN = """\
# Getting started

This guide walks you through your first run. It assumes you have Python installed and a terminal open in the project folder.

## Before you begin

You will need a few gigabytes of free disk space for the cache, and a text dataset in JSON Lines, Parquet or plain text. If you do not have one yet, the examples folder contains a small dataset you can use to try everything out.

## Your first run

Start by copying one of the example configs and editing the path so that it points at your data. Then run the prepare command and watch the progress bars as each stage finishes. When it is done, the report at the end tells you how many documents were kept, how many were dropped and why.

- Keep the first run small, so that mistakes are cheap.
- Read the report before you start a long run.
- Ask in the issue tracker if something is unclear.
"""

PROSE = {
    "ko_news": KO_NEWS,
    "ko_blog": KO_BLOG,
    "ko_wiki": KO_WIKI,
    "ko_tech_mixed": KO_TECH_MIXED,
    "ko_with_snippet": KO_WITH_SNIPPET,
    "en_news": EN_NEWS,
    "en_essay": EN_ESSAY,
    "en_wrapped": EN_WRAPPED,
    "en_inline_code": EN_INLINE_CODE,
    "en_article_with_snippet": EN_ARTICLE_WITH_SNIPPET,
    "en_markdown": EN_MARKDOWN,
}
KO_PROSE = [KO_NEWS, KO_BLOG, KO_WIKI, KO_TECH_MIXED, KO_WITH_SNIPPET]
EN_PROSE = [EN_NEWS, EN_ESSAY, EN_WRAPPED, EN_INLINE_CODE, EN_ARTICLE_WITH_SNIPPET, EN_MARKDOWN]

# --- code ---------------------------------------------------------------------------------------

CODE = {
    "python_ko_comments": '''\
"""학습 데이터를 불러와 토큰 수를 센다."""

import json
from pathlib import Path


def count_tokens(path: Path, tokenizer) -> int:
    # 한 줄에 문서 하나가 들어 있는 JSONL 파일을 읽는다.
    total = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            # 빈 문서는 건너뛴다.
            if not row.get("text"):
                continue
            total += len(tokenizer.encode(row["text"]))
    return total


class Counter:
    """문서별 토큰 수를 모아 둔다."""

    def __init__(self):
        self.counts = {}

    def add(self, key, n):
        self.counts[key] = self.counts.get(key, 0) + n
''',
    "javascript": """\
const express = require('express');
const app = express();

// parse JSON bodies
app.use(express.json());

app.get('/api/users/:id', async (req, res) => {
  const user = await db.users.findById(req.params.id);
  if (!user) {
    return res.status(404).json({ error: 'not found' });
  }
  res.json(user);
});

app.listen(3000, () => console.log('listening on 3000'));
""",
    "typescript": """\
export interface Point {
  x: number;
  y: number;
}

export function distance(a: Point, b: Point): number {
  const dx = a.x - b.x;
  const dy = a.y - b.y;
  return Math.sqrt(dx * dx + dy * dy);
}

export class Polygon {
  constructor(private readonly points: Point[]) {}

  perimeter(): number {
    let total = 0;
    for (let i = 0; i < this.points.length; i++) {
      total += distance(this.points[i], this.points[(i + 1) % this.points.length]);
    }
    return total;
  }
}
""",
    "c": """\
#include <stdio.h>
#include <stdlib.h>

/* Read integers from stdin and print their sum. */
int main(void) {
    long sum = 0;
    int x;
    while (scanf("%d", &x) == 1) {
        sum += x;
    }
    printf("%ld\\n", sum);
    return EXIT_SUCCESS;
}
""",
    "cpp": """\
#include <iostream>
#include <vector>
#include <algorithm>

template <typename T>
T median(std::vector<T> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main() {
    std::vector<double> xs{3.0, 1.0, 4.0, 1.5};
    std::cout << median(xs) << std::endl;
    return 0;
}
""",
    "java": """\
package com.example.shop;

import java.util.ArrayList;
import java.util.List;

public class Cart {
    private final List<Item> items = new ArrayList<>();

    public void add(Item item) {
        items.add(item);
    }

    public long total() {
        long sum = 0;
        for (Item item : items) {
            sum += item.price() * item.quantity();
        }
        return sum;
    }
}
""",
    "go": """\
package main

import (
	"fmt"
	"net/http"
)

func handler(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	if name == "" {
		name = "world"
	}
	fmt.Fprintf(w, "hello, %s\\n", name)
}

func main() {
	http.HandleFunc("/", handler)
	http.ListenAndServe(":8080", nil)
}
""",
    "rust": """\
use std::collections::HashMap;

/// Count how often each word appears.
pub fn word_counts(text: &str) -> HashMap<&str, usize> {
    let mut counts = HashMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word).or_insert(0) += 1;
    }
    counts
}

fn main() {
    let counts = word_counts("a b a c b a");
    println!("{:?}", counts.get("a"));
}
""",
    "shell": """\
#!/usr/bin/env bash
set -euo pipefail

# 데이터를 내려받아 압축을 푼다
DATA_DIR="${1:-data}"
mkdir -p "$DATA_DIR"
for f in train valid test; do
  if [[ ! -f "$DATA_DIR/$f.jsonl" ]]; then
    echo "missing $f" >&2
    exit 1
  fi
done
wc -l "$DATA_DIR"/*.jsonl
""",
    "sql": """\
-- monthly revenue per country
SELECT c.country,
       date_trunc('month', o.created_at) AS month,
       SUM(o.amount) AS revenue
FROM orders o
JOIN customers c ON c.id = o.customer_id
WHERE o.status = 'paid'
GROUP BY c.country, month
ORDER BY month, revenue DESC;
""",
    "html": """\
<!DOCTYPE html>
<html lang="ko">
<head>
  <meta charset="utf-8">
  <title>회사 소개</title>
  <link rel="stylesheet" href="/css/main.css">
</head>
<body>
  <div class="container">
    <h1>우리 회사를 소개합니다</h1>
    <p class="lead">함께 성장할 동료를 찾고 있습니다.</p>
    <a href="/careers" class="btn">채용 공고 보기</a>
  </div>
</body>
</html>
""",
    "json": """\
{
  "name": "moai-web",
  "version": "1.4.2",
  "private": true,
  "scripts": {
    "dev": "vite",
    "build": "tsc && vite build",
    "test": "vitest run"
  },
  "dependencies": {
    "react": "^18.2.0",
    "react-dom": "^18.2.0"
  }
}
""",
    "yaml": """\
# 학습 설정
model:
  name: llama-125m
  num_layers: 12
  hidden_size: 768
data:
  sources:
    - path: data/ko_wiki.jsonl
      text_field: text
    - path: data/en_books.parquet
      text_field: body
train:
  lr: 3.0e-4
  max_steps: 10000
  batch_size: 32
""",
}


# --- words --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("학교에서 친구를 만났다.", ["학교에서", "친구를", "만났다"]),  # eojeol are words
        ("Hello, world! It's 3.14 (roughly).", ["Hello", "world", "It's", "3.14", "roughly"]),
        ("— ... !!! 🙂 ### ---", []),  # punctuation and symbols alone are no words
        ("2024년 3월 15일", ["2024년", "3월", "15일"]),
        ("#hashtag $100 50% e-mail", ["hashtag", "100", "50", "e-mail"]),
        ("Привет, мир.", ["Привет", "мир"]),
        ("我爱北京天安门。", ["我爱", "北京", "天安", "门"]),  # Han in pieces of 2
        ("GPU를 사용했다", ["GPU를", "사용했다"]),
        ("使用Python编程", ["使用", "Python", "编程"]),
        ("ภาษาไทย", ["ภาษา", "ไทย"]),  # Thai in pieces of 4 code points
        ("", []),
    ],
)
def test_words(text, expected):
    assert words(text) == expected


def test_words_do_not_count_every_cjk_character():
    # 15 Han characters, roughly 8 words in a segmented corpus: pieces of 2 give 8, not 15
    zh = "我们今天在北京大学图书馆学习"
    assert len(zh) == 14
    assert len(words(zh)) == 7
    ja = "私は毎朝コーヒーを飲みます。"
    assert 5 <= len(words(ja)) <= 8


def test_korean_word_count_is_eojeol_count():
    text = KO_NEWS
    eojeol = [t for t in text.split() if any("가" <= c <= "힣" or c.isalnum() for c in t)]
    assert len(words(text)) == len(eojeol)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (KO_NEWS, "hangul"),
        (KO_TECH_MIXED, "hangul"),
        (EN_NEWS, "latin"),
        ("Сегодня в Москве прошёл дождь.", "other"),
        ("今日はとても良い天気ですね。", "unspaced"),
        ("ภาษาไทยเป็นภาษาที่ไม่เว้นวรรคระหว่างคำ", "unspaced"),
        ("हिन्दी भारत की एक भाषा है।", "other"),
        ("Tiếng Việt là ngôn ngữ của người Việt.", "latin"),
        ("12345 !!! 678", "none"),
    ],
)
def test_script(text, expected):
    assert script(text) == expected


def test_stats_share_work():
    s = TextStats("첫 줄입니다.\n\n  둘째 줄입니다.  \n")
    assert s.lines == ["첫 줄입니다.", "둘째 줄입니다."]
    assert s.num_words == 4
    assert s.num_word_chars == len("첫줄입니다둘째줄입니다")


# --- other languages (test_language.py drops them; test_quality.py judges Chinese and Japanese) ---

OTHER = {
    "ja": """\
東京都は来年度から、都内の公立小学校で英語の授業時間を増やす方針を明らかにした。現在は週二回の授業を三回に増やし、外国人の講師も新たに採用する予定だという。都の担当者は「子どもたちが早いうちから外国語に親しむことで、将来の選択肢が広がる」と話している。一方で、教員の負担が増えることを心配する声も上がっており、都は授業の準備を支援する仕組みを整えるとしている。
""",
    "zh": """\
近年来，越来越多的年轻人选择在周末去郊外徒步旅行。他们认为，在城市里工作了一周之后，走进大自然可以帮助自己放松心情，也能锻炼身体。不少旅行社也看到了这个机会，推出了各种各样的徒步路线，从简单的山间小路到需要两三天才能走完的长距离线路都有。专家提醒，徒步之前一定要了解天气情况，准备好足够的水和食物，并且最好结伴而行，不要一个人进入陌生的山区。
""",
    "de": """\
Die Stadt hat beschlossen, in den kommenden drei Jahren vierzig Kilometer neue Radwege zu bauen. Die Befürworter sagen, dass das Radfahren dadurch sicherer wird und mehr Menschen auf das Auto verzichten. Kritiker befürchten dagegen, dass der Verkehr auf den ohnehin vollen Straßen noch dichter wird. Die ersten Arbeiten sollen im Frühjahr beginnen und größtenteils nachts stattfinden, um die Anwohner nicht zu stören.
""",
    "fr": """\
La ville a décidé de construire quarante kilomètres de nouvelles pistes cyclables au cours des trois prochaines années. Selon ses partisans, ce projet rendra le vélo plus sûr et encouragera les habitants à laisser leur voiture au garage. Ses opposants craignent en revanche que la circulation devienne encore plus difficile dans des rues déjà encombrées. Les premiers travaux commenceront au printemps et se dérouleront surtout la nuit.
""",
    "es": """\
El ayuntamiento aprobó el martes un plan para construir cuarenta kilómetros de nuevos carriles para bicicletas durante los próximos tres años. Los defensores del proyecto aseguran que hará más seguro el uso de la bicicleta y que reducirá el tráfico en el centro de la ciudad. Los comerciantes, sin embargo, temen perder clientes por la eliminación de plazas de aparcamiento en varias calles principales.
""",
    "ru": """\
Городской совет во вторник одобрил план строительства сорока километров новых велосипедных дорожек в течение ближайших трёх лет. Сторонники проекта считают, что он сделает езду на велосипеде безопаснее и поможет сократить количество машин в центре города. Противники опасаются, что движение на и без того загруженных улицах станет ещё медленнее.
""",
    "vi": """\
Hội đồng thành phố đã thông qua kế hoạch xây dựng thêm bốn mươi cây số làn đường dành cho xe đạp trong ba năm tới. Những người ủng hộ cho rằng kế hoạch này sẽ giúp việc đi xe đạp an toàn hơn và giảm ùn tắc giao thông ở trung tâm thành phố. Tuy nhiên, một số chủ cửa hàng lo ngại sẽ mất khách vì chỗ đỗ xe bị thu hẹp.
""",
}
