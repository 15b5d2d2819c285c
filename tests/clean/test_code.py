"""The code detector: code files, and prose records that carry a program, are code; prose is not."""

# ruff: noqa: E501

from __future__ import annotations

import random
from collections import Counter

import pytest
from test_words import CODE, OTHER, PROSE

from conftest import load_clean_corpus
from moai.clean.code import is_code


@pytest.mark.parametrize("name", sorted(CODE))
def test_code_files_are_code(name):
    assert is_code(CODE[name]), name


QUOTING = {"en_article_with_snippet", "ko_with_snippet"}  # tutorials that quote a 2-3 line program


@pytest.mark.parametrize("name", sorted(set(PROSE) - QUOTING))
def test_prose_is_not_code(name):
    assert not is_code(PROSE[name]), name


@pytest.mark.parametrize("name", sorted(QUOTING))
def test_prose_that_quotes_a_program_is_code(name):
    # mixed prose and code counts as code (6% and 13% of their characters are the program) ...
    assert is_code(PROSE[name]), name
    # ... but not a long page with the same snippet
    text = PROSE[name]
    longer = text + "\n\n".join(p for p in text.split("\n\n") if "(" not in p) * 3
    assert not is_code(longer), name


@pytest.mark.parametrize("lang", sorted(OTHER))
def test_other_languages_are_not_code(lang):
    assert not is_code(OTHER[lang])


def test_code_edge_cases():
    assert not is_code("")
    assert not is_code("   \n\n")
    assert not is_code("짧은 문장이다.")
    assert not is_code("Call print() to see it.")
    assert is_code("x = {'a': [1, 2]}\n")
    assert is_code("def f(x):\n    return x * 2\n")


# Instruction + solution records as instruction datasets join their fields (`text_template`).
RECORDS = {
    "script_two_lines": """\
Reverse the string read from standard input.
s = input()
print(s[::-1])
""",
    "en_plain_one_liner": """\
Write a Python function that returns the squares of the even numbers in a list.
def even_squares(nums):
    return [n * n for n in nums if n % 2 == 0]
""",
    "ko_fenced": """\
정수 리스트를 받아 가장 긴 증가 부분 수열의 길이를 반환하는 함수를 작성하세요. 리스트가 비어 있으면 0을 반환해야 합니다.

```python
def longest_increasing(nums):
    # 각 위치에서 끝나는 가장 긴 길이를 기록한다
    best = [1] * len(nums)
    for i in range(len(nums)):
        for j in range(i):
            if nums[j] < nums[i]:
                best[i] = max(best[i], best[j] + 1)
    return max(best, default=0)
```
""",
    "alpaca": """\
### Instruction:
Implement a stack class with push, pop and peek. Popping an empty stack should raise an error.

### Response:
class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        return self.items[-1]
""",
    "contest_statement": """\
You are given an array of n integers a1, a2, ..., an. In one operation you may choose two adjacent elements and replace them with their sum. Find the minimum number of operations needed to make every element of the array even, or report that it is impossible. The answer may be large, so think about the parity of each element rather than its value, and note that the order of the elements matters only through the positions of the odd ones.

Input
The first line contains a single integer n (1 ≤ n ≤ 2·10^5). The second line contains n integers a1, ..., an (1 ≤ ai ≤ 10^9).

Output
Print the minimum number of operations, or -1 if it is impossible.

import sys
data = sys.stdin.read().split()
n = int(data[0])
odd = [i for i, x in enumerate(data[1:n + 1]) if int(x) % 2]
print(-1 if len(odd) % 2 else sum(odd[k + 1] - odd[k] for k in range(0, len(odd), 2)))
""",
    "docstring_heavy": '''\
Write a function `parse_version` that parses a version string like "1.2.3" into a tuple of integers.

```python
def parse_version(text):
    """
    Parse a dotted version string into a tuple of integers.

    :param text: A version string such as "1.2.3". Leading and trailing spaces are ignored.
    :return: A tuple of integers, one per part of the version.
    :raises ValueError: If a part is not a number.
    """
    return tuple(int(part) for part in text.strip().split("."))
```

The function splits on dots and converts each part, so "1.10" sorts after "1.9" as a tuple.
''',
    "ko_qa_with_explanation": """\
질문: 문자열에서 모음의 개수를 세는 함수를 작성하세요.
답변:
def count_vowels(text):
    return sum(1 for ch in text.lower() if ch in "aeiou")
이 함수는 문자열을 한 번만 순회하므로 시간 복잡도는 O(n)입니다. 대문자도 소문자로 바꾸어 함께 셉니다.
""",
    "javascript_answer": """\
How do I remove duplicates from an array in JavaScript while keeping the order?

You can use a Set, which remembers insertion order:

```js
const unique = (items) => [...new Set(items)];
console.log(unique([3, 1, 3, 2, 1]));
```

This works for primitive values; objects are compared by reference.
""",
    "cpp": """\
Given an array of integers, return the number of pairs whose sum is even.
#include <bits/stdc++.h>
using namespace std;
int main() {
    int n; cin >> n;
    vector<long long> a(n);
    for (auto &x : a) cin >> x;
    long long even = 0, odd = 0;
    for (auto x : a) (x % 2 ? odd : even)++;
    cout << even * (even - 1) / 2 + odd * (odd - 1) / 2 << endl;
    return 0;
}
""",
    "java": """\
Write a Java method that reverses a string without using StringBuilder.reverse().

public static String reverse(String s) {
    char[] chars = s.toCharArray();
    for (int i = 0, j = chars.length - 1; i < j; i++, j--) {
        char t = chars[i];
        chars[i] = chars[j];
        chars[j] = t;
    }
    return new String(chars);
}
""",
    "chat": """\
User: 리스트에서 두 번째로 큰 수를 찾는 파이썬 코드를 알려줘.
Assistant: 아래처럼 집합으로 중복을 없앤 뒤 정렬하면 됩니다.

```python
def second_largest(nums):
    uniq = sorted(set(nums))
    return uniq[-2] if len(uniq) >= 2 else None
```

리스트에 서로 다른 값이 두 개 미만이면 None을 반환합니다.""",
    "sql": """\
Write a SQL query that returns the three customers with the highest total order amount.
SELECT customer_id, SUM(amount) AS total
FROM orders
GROUP BY customer_id
ORDER BY total DESC
LIMIT 3;
""",
    "ko_long_problem": """\
문제
N개의 정수로 이루어진 수열이 주어진다. 이 수열에서 연속된 몇 개의 수를 골라 구할 수 있는 합 중 가장 큰 합을 구하는 프로그램을 작성하시오. 단, 수는 한 개 이상 선택해야 한다. 예를 들어 10, -4, 3, 1, 5, 6, -35, 12, 21, -1 이라는 수열이 주어졌다고 하자. 여기서 정답은 12+21인 33이 정답이 된다.

입력
첫째 줄에 정수 n(1 ≤ n ≤ 100,000)이 주어지고 둘째 줄에는 n개의 정수로 이루어진 수열이 주어진다. 수는 -1,000보다 크거나 같고, 1,000보다 작거나 같은 정수이다.

출력
첫째 줄에 답을 출력한다.

n = int(input())
a = list(map(int, input().split()))
best = cur = a[0]
for x in a[1:]:
    cur = max(x, cur + x)
    best = max(best, cur)
print(best)
""",
}


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_instruction_and_solution_records_are_code(name):
    assert is_code(RECORDS[name]), name


NOT_CODE = {
    "recipe": """\
Ingredients:
2 cups of flour
1 teaspoon of salt
3 eggs

Mix the flour and the salt in a large bowl. Add the eggs one at a time and stir until the dough is smooth. Let it rest for twenty minutes before you roll it out.
""",
    "menu": "Home | About | Contact\nProducts | Services | Blog\nLogin | Register | Cart\n" * 5,
    "math_in_prose": """\
The area of a circle is A = πr², so doubling the radius makes the area four times larger. If the radius is 3 cm, the area is about 28.3 square centimetres, and with a radius of 6 cm it grows to about 113 square centimetres. Engineers use this relation every day when they size pipes, because the flow a pipe can carry grows with its cross-section rather than with its width.
""",
    "symbol_soup": "!@#$%^&*()_+-=[]{}|;:,.<>?/~\n" * 20,
}


@pytest.mark.parametrize("name", sorted(NOT_CODE))
def test_prose_and_junk_with_code_symbols_are_not_code(name):
    assert not is_code(NOT_CODE[name]), name


def test_the_held_out_generators_records_are_code_and_its_junk_is_not():
    gen = load_clean_corpus()
    rng = random.Random(7)
    records = [gen.instruction_record(rng) for _ in range(600)]
    missed = Counter(layout for layout, text in records if not is_code(text))
    assert not missed, missed
    planted = [gen.planted_in_code(rng, gen.code_eval_item(rng))[1] for _ in range(100)]
    assert all(map(is_code, planted))
    low = [gen.low_quality(rng) for _ in range(500)]
    assert sum(is_code(text) for _, text in low) <= 5, Counter(sub for sub, text in low if is_code(text))
    prose = [gen.en_prose(rng) for _ in range(100)] + [gen.ko_prose(rng) for _ in range(100)]
    assert not any(map(is_code, prose))
    assert not any(is_code(gen.other_language(rng)[1]) for _ in range(200))
