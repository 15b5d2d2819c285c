"""The cleaning stages on a held-out-style corpus (benchmarks/clean_corpus.py) against its ground truth.

The corpus mixes English and Korean prose, code, other languages, low-quality pages, exact copies
(identical, whitespace-only and NFKC-only changes), near copies (1–6% of the words changed, the
true word 5-gram Jaccard recorded) and evaluation items planted in documents. The checks: every
exact copy dropped as `exact_duplicate` naming its original; near copies at Jaccard ≥ 0.8 found
with recall ≥ 0.9 and precision ≥ 0.95 (a drop is right when it is a planted near copy at ≥ 0.8,
or when the row its detail names is kept and is ≥ 0.8 similar); every planted item caught; the
stage reports count what the dropped rows say. On Korean, English and code (`--mix code`,
instruction + Python solution records): code kept by the quality and language stages, low-quality
pages and other languages still dropped, and items planted in code caught. Then: `kill -9` of `moai prepare` during
signatures and during dedup, and a rerun gives the keys and rows of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import datasets
import pyarrow as pa
import pytest

from conftest import load_clean_corpus
from moai import pipeline
from moai.clean.minhash import exact_keys
from moai.clean.shingles import shingle_set
from moai.config import parse_config
from moai.formats.text import MappedTable

clean_corpus = load_clean_corpus()


def config(corpus, cache: Path, tokenizer_dir: Path, **extra) -> dict:
    return {
        "cache_dir": str(cache),
        "source": {"path": str(corpus.data)},
        "dedup": {"exact": True, "near": {"threshold": 0.8, "ngram": 5, "num_perm": 112}},
        "decontaminate": {"path": str(corpus.evals), "text_field": "question", "ngram": 13},
        "keep_dropped": True,
        "tokenizer": {"path": str(tokenizer_dir)},
        "pack": {"seq_len": 64},
        **extra,
    }


def dropped(result) -> list[dict]:
    return datasets.load_from_disk(f"{result.path}/dropped").to_list()


def kept(result) -> list[str]:
    return MappedTable(result.path).table.column(0).to_pylist()


def jaccard(a: str, b: str) -> float:
    x, y = shingle_set(a, 5), shingle_set(b, 5)
    return len(x & y) / len(x | y)


def test_the_ground_truth_holds(tmp_path):
    corpus = clean_corpus.generate(tmp_path, 400, seed=3)
    docs, texts = corpus.docs, corpus.texts
    assert [json.loads(line)["text"] for line in corpus.data.open(encoding="utf-8")] == texts
    assert json.loads(corpus.truth.read_text())["docs"] == docs
    kinds = Counter(d["kind"] for d in docs)
    assert set(kinds) == {"en", "ko", "code", "other", "low", "planted", "exact_dup", "near_dup"}
    keys = exact_keys(pa.array(texts))
    evals = {e["id"]: e["question"] for e in map(json.loads, corpus.evals.open(encoding="utf-8"))}
    assert len(evals) == 5 * kinds["planted"]
    for i, d in enumerate(docs):
        if d["kind"] in ("exact_dup", "near_dup"):
            o = d["original"]
            assert o < i and docs[o]["kind"] in ("en", "ko", "code")
        if d["kind"] == "exact_dup":
            assert (keys[i] == keys[d["original"]]).all()
            assert (texts[i] == texts[d["original"]]) == (d["variant"] == "identical")
        elif d["kind"] == "near_dup":
            assert d["jaccard"] == pytest.approx(jaccard(texts[i], texts[d["original"]]), abs=1e-6)
            assert d["jaccard"] < 1
        elif d["kind"] == "planted":
            q = evals[d["eval_id"]]
            assert 15 <= len(q.split()) <= 40
            assert q not in texts[i]  # disguised ...
            words = " ".join(re.sub(r"[^\w\s]", " ", texts[i].lower()).split())
            assert " ".join(re.sub(r"[^\w\s]", " ", q.lower()).split()) in words  # ... but there
    assert min(len(t.split()) for t, d in zip(texts, docs, strict=True) if d["kind"] == "en") >= 100
    assert len(set(texts)) == len(texts) - sum(d.get("variant") == "identical" for d in docs)


@pytest.mark.slow
def test_dedup_and_decontaminate_against_the_ground_truth(tmp_path, tokenizer_dir):
    corpus = clean_corpus.generate(tmp_path / "corpus", 2500, seed=11)
    docs, texts = corpus.docs, corpus.texts
    cfg = parse_config(config(corpus, tmp_path / "cache", tokenizer_dir))
    res = pipeline.walk(cfg, until="decontaminate")

    gone = dropped(res["dedup"])
    for row in gone:  # `row` is the line of the jsonl (nothing before dedup drops a row here)
        assert texts[row["row"]] == row["text"]
    by_reason: dict[str, dict[int, dict]] = {}
    for row in gone:
        by_reason.setdefault(row["reason"], {})[row["row"]] = row
    assert res["dedup"].report["dropped"] == {r: len(rows) for r, rows in by_reason.items()}
    assert res["dedup"].report["rows_out"] == len(texts) - len(gone)
    removed = set().union(*by_reason.values())

    # exact: every copy, and nothing else, naming its original
    exact = {i: d for i, d in enumerate(docs) if d["kind"] == "exact_dup"}
    assert set(by_reason["exact_duplicate"]) == set(exact)
    for i, d in exact.items():
        assert by_reason["exact_duplicate"][i]["detail"] == f"copy of row {d['original']}"

    # near: recall over the planted copies at Jaccard ≥ 0.8, precision over every near drop
    planted = {i for i, d in enumerate(docs) if d["kind"] == "near_dup" and d["jaccard"] >= 0.8}
    found = set(by_reason.get("near_duplicate", {}))
    recall = len(found & planted) / len(planted)
    right = 0
    for i, row in by_reason.get("near_duplicate", {}).items():
        named = int(re.match(r"near copy of row (\d+)", row["detail"]).group(1))
        if i in planted or (named not in removed and jaccard(texts[i], texts[named]) >= 0.8):
            right += 1
    precision = right / len(found)
    missed = sorted(planted - found)
    assert recall >= 0.9, f"recall {recall:.3f}: missed {[(i, docs[i]['jaccard']) for i in missed[:10]]}"
    assert precision >= 0.95, f"precision {precision:.3f}"
    assert len(planted) >= 80  # the corpus has enough near copies for the ratios to mean something

    # decontaminate: every planted evaluation item, and nothing else; its rows index dedup's output
    after_dedup = [t for i, t in enumerate(texts) if i not in removed]
    line_of = {t: i for i, t in reversed(list(enumerate(texts)))}
    contaminated = dropped(res["decontaminate"])
    for row in contaminated:
        assert after_dedup[row["row"]] == row["text"] and row["reason"] == "contaminated"
    caught = {line_of[row["text"]] for row in contaminated}
    assert caught == {i for i, d in enumerate(docs) if d["kind"] == "planted"}
    eval_lines = {json.loads(line)["id"]: n for n, line in enumerate(corpus.evals.open(encoding="utf-8"), 1)}
    for row in contaminated:
        where = row["detail"].rsplit(":", 1)[1]
        assert int(where) == eval_lines[docs[line_of[row["text"]]]["eval_id"]], row["detail"]
    assert res["decontaminate"].report["dropped"] == {"contaminated": len(caught)}
    assert kept(res["decontaminate"]) == [t for t in after_dedup if line_of[t] not in caught]


@pytest.mark.slow
def test_quality_and_language_keep_korean_english_and_code(tmp_path, tokenizer_dir):
    corpus = clean_corpus.generate(tmp_path / "corpus", 1500, seed=12)
    docs, texts = corpus.docs, corpus.texts
    extra = {"quality": {"rules": "gopher"}, "language": {"keep": ["ko", "en"]}}
    cfg = parse_config(config(corpus, tmp_path / "cache", tokenizer_dir, **extra))
    res = pipeline.walk(cfg, until="decontaminate")
    line_of = {t: i for i, t in reversed(list(enumerate(texts)))}
    verdict: dict[int, str] = {}
    for stage in ("quality", "language"):
        for row in dropped(res[stage]):
            verdict[line_of[row["text"]]] = row["reason"]
        assert res[stage].report["dropped"] == dict(Counter(row["reason"] for row in dropped(res[stage])))
    wrongly = {i: (docs[i], r) for i, r in verdict.items() if docs[i]["kind"] in ("en", "ko", "code", "planted")}
    assert not wrongly, f"{len(wrongly)} prose/code documents dropped, e.g. {list(wrongly.items())[:5]}"
    for i, d in enumerate(docs):
        if d["kind"] == "other":
            assert i in verdict, f"line {i} ({d['lang']}) kept: {texts[i][:80]!r}"
            assert verdict[i] == f"language:{d['lang']}" or verdict[i].startswith("gopher:"), (d, verdict[i])
    low = [i for i, d in enumerate(docs) if d["kind"] == "low"]
    caught = [i for i in low if i in verdict]
    assert len(caught) >= 0.9 * len(low), Counter(docs[i]["sub"] for i in low if i not in verdict)


# --- kill -9 mid-way, then a rerun ---------------------------------------------------------------


def _published(cache: Path, stage: str) -> bool:
    folder = cache / stage
    return folder.is_dir() and any(not p.name.startswith(".") and p.is_dir() for p in folder.iterdir())


def _prepare_killed_after(config_path: Path, cache: Path, stage: str, timeout: float = 120) -> bool:
    """Start `moai prepare`, SIGKILL its whole process group as soon as `stage` is published;
    whether the kill landed before the next stage (`dedup` or `decontaminate`) was published."""
    nxt = {"filter": "signatures", "signatures": "dedup"}[stage]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moai.cli", "prepare", str(config_path), "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    try:
        while not _published(cache, stage):
            assert proc.poll() is None, f"moai prepare ended (rc {proc.returncode}) before {stage} was published"
            assert time.monotonic() < deadline, f"{stage} not published in {timeout} s"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return not _published(cache, nxt)


@pytest.mark.slow
def test_a_rerun_after_kill_9_gives_the_output_of_an_uninterrupted_run(tmp_path, tokenizer_dir):
    import yaml

    corpus = clean_corpus.generate(tmp_path / "corpus", 2000, seed=13)
    cfg_dict = config(corpus, tmp_path / "cache", tokenizer_dir)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg_dict))
    cache = tmp_path / "cache"
    # killed while computing the signatures, then (a second run) while deduplicating
    assert _prepare_killed_after(path, cache, "filter")
    assert _prepare_killed_after(path, cache, "signatures")
    assert not _published(cache, "dedup")

    cfg = parse_config(cfg_dict)
    rerun = pipeline.walk(cfg, until="save")
    assert not rerun["signatures"].built and rerun["dedup"].built
    ref_cfg = parse_config({**cfg_dict, "cache_dir": str(tmp_path / "ref")})
    ref = pipeline.walk(ref_cfg, until="save")
    assert {n: r.key for n, r in rerun.items()} == {n: r.key for n, r in ref.items()}
    for stage in ("dedup", "decontaminate"):
        assert kept(rerun[stage]) == kept(ref[stage])
        assert dropped(rerun[stage]) == dropped(ref[stage])
        assert rerun[stage].report["dropped"] == ref[stage].report["dropped"]
    leftovers = list(cache.rglob(".tmp-*"))
    assert not leftovers, leftovers


# --- Korean, English and code: instruction + solution records (issue 24) ---------------------------

CODE_SETUPS = {
    "quality": {"quality": {"rules": ["gopher", "c4", "fineweb"]}},
    "language": {"language": {"keep": ["ko", "en"], "min_score": 0.65}},
    "all": {"quality": {"rules": ["gopher", "c4", "fineweb"]}, "language": {"keep": ["ko", "en"]}},
}


def test_code_is_kept_by_quality_and_language_and_items_planted_in_it_are_caught(tmp_path, tokenizer_dir):
    corpus = clean_corpus.generate(tmp_path / "corpus", 1500, seed=21, mix="code")
    docs, texts = corpus.docs, corpus.texts
    kind_of = {t: d["kind"] for t, d in zip(texts, docs, strict=True)}
    total = Counter(d["kind"] for d in docs)
    code = sum(total[k] for k in clean_corpus.CODE_KINDS)
    assert total["instruct"] >= 400 and total["planted_code"] >= 25 and total["low"] >= 80 and total["other"] >= 80
    for name, extra in CODE_SETUPS.items():
        cfg = config(corpus, tmp_path / "cache", tokenizer_dir, dedup=None, **extra)
        if name != "all":
            cfg.pop("decontaminate")
        res = pipeline.walk(parse_config(cfg), until="decontaminate" if name == "all" else name)
        stages = [s for s in ("quality", "language") if s in extra]
        survived = Counter(kind_of[t] for t in kept(res[stages[-1]]))
        assert sum(survived[k] for k in clean_corpus.CODE_KINDS) >= 0.98 * code, (name, survived)
        if "quality" in extra:
            assert survived["low"] <= 0.1 * total["low"], (name, survived)
        if "language" in extra:
            assert survived["other"] <= 0.1 * total["other"], (name, survived)
        for stage in stages:  # every code document is counted as exempted (none of the prose is code)
            exempt = res[stage].report["counts"]["code_exempt"]
            assert code <= exempt <= code + 0.01 * len(texts), (name, stage, exempt)
        assert survived["en"] + survived["ko"] == total["en"] + total["ko"], (name, survived)

    # decontaminate: every planted item that reached it, in prose and in code, and nothing else
    reached = [t for t in kept(res["language"]) if kind_of[t] in ("planted", "planted_code")]
    assert Counter(kind_of[t] for t in reached) == {"planted": total["planted"], "planted_code": total["planted_code"]}
    contaminated = dropped(res["decontaminate"])
    assert sorted(row["text"] for row in contaminated) == sorted(reached)
    assert {row["reason"] for row in contaminated} == {"contaminated"}
    eval_lines = {json.loads(line)["id"]: n for n, line in enumerate(corpus.evals.open(encoding="utf-8"), 1)}
    line_of = {t: i for i, t in enumerate(texts)}
    for row in contaminated:
        assert int(row["detail"].rsplit(":", 1)[1]) == eval_lines[docs[line_of[row["text"]]]["eval_id"]], row["detail"]
    assert Counter(
        docs[line_of[row["text"]]]["where"] for row in contaminated if kind_of[row["text"]] == "planted_code"
    ).keys() == {
        "instruction",
        "docstring",
        "comment",
    }


@pytest.mark.slow
def test_the_documented_code_benchmark_runs(tmp_path):
    # docs/cleaning.md's command, on a small corpus: a row per setup and the JSON line at the end
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "clean_code.py"
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--docs", "600"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(result["setups"]) == {"quality gopher", "quality c4", "quality fineweb", "quality gopher+c4+fineweb",
                                     "language ko,en", "all"}  # fmt: skip
    assert all(s["code_kept"] >= 0.98 for s in result["setups"].values())
    caught, reached = map(int, result["setups"]["all"]["planted_caught"].split("/"))
    assert caught == reached > 0
    assert "| all | 100.00% of" in out.stdout
