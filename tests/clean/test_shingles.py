"""Near-dedup's shingles and MinHash signatures against datatrove's, document by document.

moai's MinHash follows datatrove's definition (0.10, 64-bit xxhash) so that both tools make the
same candidate pairs for the same seed; these tests hold it to that on a generated corpus of
English, Korean, code, other scripts and low-quality text, plus edge cases, and check the
vectorised XXH64 against the xxhash package.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash

from moai.clean.minhash import MinHasher
from moai.clean.shingles import shingles
from moai.clean.xxh64 import LONG, xxh64_spans

ROOT = Path(__file__).resolve().parents[2]

EDGE_CASES = [
    "",
    "   \n\t ",
    "one",
    "two words",
    "Café  naïve — résumé: 12,5 kg at 3.14 and ٣٤",
    "학교에서 공부합니다. 서울 2024년 3월, 날씨가 좋다!",
    "def f(x):\n\treturn x**2  # 3.14\n\nclass A_b: pass",
    "日本語のテキスト、句読点。ok 中文，标点！",
    "x\u00a0y\u3000z\u2009w v\u2028u t\u202fs r",
    "\x1c\x1dword\x85w2 a b c d e",
    "a\u0301 \u0301 b c d e f \u0301\u0301",
    "Ünïcödé ÅNGSTRÖM ﬁne ligature ½ ² ①",
    "emoji 🙂🙂 and ZWJ 👩\u200d💻 with zero\u200bwidth",
    "x" * 1000 + " " + "y" * 300 + " short words after a long one",
]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> list[str]:
    corpus = _load("clean_corpus").generate(tmp_path_factory.mktemp("corpus"), 600, seed=5)
    return corpus.texts + EDGE_CASES


def _datatrove(n: int, seed: int, tmp: Path):
    """datatrove's MinhashDedupSignature with whitespace words of its simplified text (spaCy, its
    English tokenizer, is not installed; on punctuation-free text it gives the same words)."""
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
    from datatrove.utils.hashing import HashConfig

    bench = _load("dedup")
    cfg = MinhashConfig(
        hash_config=HashConfig(precision=64, hash_fc="xxhash"),
        n_grams=n,
        num_buckets=14,
        hashes_per_bucket=8,
        seed=seed,
    )
    step = MinhashDedupSignature(str(tmp / "sigs"), config=cfg, language=bench._split_tokenizer())
    # datatrove 0.10.1 hands str to xxhash, which xxhash 4 refuses: hash the UTF-8 bytes, as xxhash 3 did
    step._hash_func = lambda s: xxhash.xxh64_intdigest(s.encode())
    return step


def test_xxh64_equals_the_xxhash_package_at_every_length():
    rng = np.random.default_rng(0)
    buf = os.urandom(4096) + "학교에서 café ok".encode() * 100
    starts, ends = [], []
    for length in [*range(0, 300), LONG - 1, LONG, LONG + 1, 1000, 3000]:
        for _ in range(3):
            s = int(rng.integers(0, len(buf) - length))
            starts.append(s)
            ends.append(s + length)
    got = xxh64_spans(buf, np.array(starts), np.array(ends))
    assert got.tolist() == [xxhash.xxh64_intdigest(buf[s:e]) for s, e in zip(starts, ends, strict=True)]


def test_shingles_equal_datatrove_document_by_document(texts, tmp_path):
    step = _datatrove(5, 1, tmp_path)
    ours = shingles(texts, 5)
    differ = []
    for i, text in enumerate(texts):
        ref = step.get_shingles(text).ravel().tolist()
        got = ours.hashes[ours.offsets[i] : ours.offsets[i + 1]].tolist()
        words = len(" ".join(text.split()).split(" ")) if text.strip() else 0
        if not ref and 0 < words < 5:  # datatrove has none below n words; moai one of all words
            assert len(got) <= 1, i
            continue
        if ref != got:
            differ.append(i)
    assert differ == []


def test_the_documented_case_differences(tmp_path):
    """Arrow lower-cases a final capital sigma to σ where Python (datatrove) gives ς."""
    step = _datatrove(1, 1, tmp_path)
    got = shingles(["ΣΊΣΥΦΟΣ one"], 1).hashes.tolist()
    ref = step.get_shingles("ΣΊΣΥΦΟΣ one").ravel().tolist()
    assert got[1] == ref[1] and got[0] != ref[0]


@pytest.mark.parametrize("seed", [1, 7])
def test_signatures_equal_datatrove_document_by_document(texts, tmp_path, seed):
    step = _datatrove(5, seed, tmp_path)
    sig, has = MinHasher(5, 112, 14, 8, seed=seed).signatures(texts)
    compared = 0
    for i, text in enumerate(texts):
        sh = step.get_shingles(text)
        if not sh.size:
            continue
        ref = np.concatenate([np.array(b, dtype=np.uint64) for b in step.get_signature(sh)])
        assert has[i]
        assert (sig[i] == ref).all(), f"document {i}: {text[:60]!r}"
        compared += 1
    assert compared >= 600


def test_shingles_do_not_depend_on_the_batch(texts):
    rng = random.Random(0)
    sample = rng.sample(texts, 40) + EDGE_CASES
    together = shingles(sample, 5)
    for i, t in enumerate(sample):
        alone = shingles([t], 5).hashes.tolist()
        assert alone == together.hashes[together.offsets[i] : together.offsets[i + 1]].tolist()
    counts = shingles(["", "one", "a b c d e f g"], 5).counts().tolist()
    assert counts == [0, 1, 3]  # no word: none; fewer than n: one of all; else one per window


def test_string_types_slices_and_nulls_give_the_same_shingles():
    import pyarrow as pa

    t = ["Café one two three four five six", "학교에서 공부를 했다 그리고 집에 갔다", "", None]
    ref = shingles(pa.array(t, type=pa.string()), 3)
    assert ref.counts().tolist() == [5, 4, 0, 0]
    for other in (
        pa.array(t, type=pa.large_string()),
        pa.chunked_array([pa.array(t[:2]), pa.array(t[2:], type=pa.string())]),
        pa.array(["x", *t]).slice(1),
    ):
        got = shingles(other, 3)
        assert got.hashes.tolist() == ref.hashes.tolist()
        assert got.offsets.tolist() == ref.offsets.tolist()


def test_the_mersenne_reduction_matches_python_integers_including_its_rare_branch():
    """((a·x + b) mod 2^64) mod (2^61 − 1) per document minimum, against Python's integers; the
    crafted x = 2^62 − 2 with a = 1, b = 0 reduces to hi + lo = p, the branch taken once in ~2^58."""
    from moai.clean.minhash import _min_hashes
    from moai.clean.ngrams import Ngrams

    p = (1 << 61) - 1
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2**63, size=300, dtype=np.int64).astype(np.uint64)
    x[17] = np.uint64((1 << 62) - 2)
    offsets = np.array([0, 17, 18, 18, 300], dtype=np.int64)  # the crafted value alone; an empty document
    a = np.array([1, *rng.integers(1, p, size=4)], dtype=np.uint64)
    b = np.array([0, *rng.integers(0, p, size=4)], dtype=np.uint64)
    out = np.full((4, 5), np.iinfo(np.uint64).max, dtype=np.uint64)
    _min_hashes(Ngrams(x, offsets), a, b, out)
    for d in range(4):
        xs = [int(v) for v in x[offsets[d] : offsets[d + 1]]]
        for j in range(5):
            want = min(((int(a[j]) * v + int(b[j])) % 2**64) % p for v in xs) if xs else 2**64 - 1
            assert int(out[d, j]) == want, (d, j)
    assert int(out[1, 0]) == 0
