"""Regenerate moai/assets/tiny.jsonl, the embedded corpus of the `tiny` preset.

Seeded and self-contained: English-like prose, Korean prose, Python snippets, and a few
empty/whitespace rows so the filter stage has something to count.
Run: python scripts/make_tiny_corpus.py
"""

import json
import random
from pathlib import Path

EN = (
    "the model reads tokens from a packed stream and learns to predict the next one "
    "data pipelines should be fast safe and observable every stage writes one folder "
    "a cache key hashes the input fingerprint the settings and the version of a stage "
    "training on packed rows wastes no compute on padding and resumes exactly"
).split()
KO = (
    "모델은 다음 토큰을 예측하도록 학습합니다 데이터 파이프라인은 빠르고 안전해야 합니다 "
    "한국어 문서와 코드가 함께 들어 있는 말뭉치를 토큰화합니다 캐시는 입력의 지문으로 구분됩니다"
).split()
CODE = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import numpy as np\nx = np.arange(16).reshape(4, 4)\nprint(x.sum(axis=0))\n",
    "with open(path) as f:\n    lines = [line.strip() for line in f]\n",
]


def sentence(rng, words):
    n = rng.randint(6, 18)
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."


TINY_JSONL = Path(__file__).resolve().parents[1] / "moai" / "assets" / "tiny.jsonl"


def main(out=TINY_JSONL, n=3000, seed=0):
    rng = random.Random(seed)
    with open(out, "w", encoding="utf-8") as f:
        for i in range(n):
            kind = rng.random()
            if i % 500 == 7:
                text = " " * (i % 3)
            elif kind < 0.5:
                text = " ".join(sentence(rng, EN) for _ in range(rng.randint(1, 8)))
            elif kind < 0.8:
                text = " ".join(sentence(rng, KO) for _ in range(rng.randint(1, 6)))
            else:
                text = "".join(rng.choice(CODE) for _ in range(rng.randint(1, 4)))
            f.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
