"""benchmarks/prepare_e2e.py --check-moai: a token store against transformers, every document."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from conftest import load_benchmark, make_texts, saved_text
from moai.stages import tokenize as tk
from moai.stages.tokenizer import describe, load_tokenizer


def test_the_check_counts_every_document_and_names_the_first_that_differs(tmp_path, bos_tokenizer_dir):
    bench = load_benchmark("prepare_e2e")
    texts = [*make_texts(300, seed=5), "", "한국어 문장 <bos> as text"]
    saved = saved_text(tmp_path, texts)
    hf = load_tokenizer(str(bos_tokenizer_dir))
    out = tmp_path / "store"
    out.mkdir()
    tk.tokenize(describe(hf, str(bos_tokenizer_dir), "fp"), saved, out, num_proc=1, threads_per_proc=1, batch_size=64)
    in_order = bench._texts(saved)  # train then validation, as the store holds them
    assert sorted(in_order) == sorted(texts)

    tokens, lengths = bench.read_moai(str(out))
    assert bench.check_ids(tokens, lengths, in_order, Path(bos_tokenizer_dir)) == (
        f"of {len(texts):,} documents, {len(texts):,} equal transformers' tokenizer(text) + EOS, "
        "0 its ids without special tokens + EOS"
    )
    at = int(lengths[:7].sum()) + 2  # document 7's third id
    changed = tokens.copy()
    changed[at] = (int(changed[at]) + 1) % hf.vocab_size
    report = bench.check_ids(changed, lengths, in_order, Path(bos_tokenizer_dir))
    assert report.startswith(f"of {len(texts):,} documents, {len(texts) - 1:,} equal")
    assert report.endswith("first of neither: document 7, token 2")
    assert bench.check_ids(tokens, np.asarray(lengths[:-1]), in_order, Path(bos_tokenizer_dir)).startswith(
        f"{len(texts) - 1:,} documents, transformers {len(texts):,}"
    )


def test_the_korean_corpus_option_replaces_every_nth_output_with_korean_of_at_least_its_size(tmp_path):
    corpus = load_benchmark("make_corpus")
    (tmp_path / "a").mkdir()
    law = "대한민국은 민주공화국이다. 모든 권력은 국민으로부터 나온다.\n국회는 법률을 만든다.\n"
    (tmp_path / "a" / "law.txt").write_text(law)
    (tmp_path / "b.txt").write_text("short\n헌법재판소의 장은 국회의 동의를 얻어 재판관중에서 대통령이 임명한다")
    recs = [{"instruction": "q", "input": "", "output": "x" * n} for n in (5, 300, 40, 0, 90, 1)]
    kept = [dict(r) for r in recs]
    corpus.korean_outputs(recs, tmp_path, 2)
    for i, (r, before) in enumerate(zip(recs, kept, strict=True)):
        if i % 2:
            assert r == before
        else:
            assert len(r["output"].encode()) >= len(before["output"].encode())
            assert r["output"] == "" or all("\uac00" <= ch <= "\ud7a3" for ch in r["output"] if ch.isalpha())
    again = [dict(r) for r in kept]
    corpus.korean_outputs(again, tmp_path, 2)
    assert again == recs  # seeded: the same corpus every time
