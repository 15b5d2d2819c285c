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
