"""The dedup and decontaminate stages on small real corpora through the stage graph: exact copies
(NFKC and whitespace variants), near copies, copies across sources, the dropped rows kept with
their reasons, the signature units, and evaluation texts planted in documents."""

from __future__ import annotations

import json
import random

import datasets
import numpy as np
import pytest

from conftest import config_dict, store_files, write_jsonl
from moai import pipeline
from moai.clean.minhash import MinHasher, candidate_probability, derive_bands, exact_keys, first_copies
from moai.clean.ngrams import ngram_set, text_ngrams
from moai.clean.shingles import shingle_set
from moai.config import ConfigError, parse_config
from moai.errors import DataError
from moai.formats.text import MappedTable
from moai.stages import signatures


def _word(i: int) -> str:  # letters only: near-dedup's shingles turn every number into 0 (as datatrove's do)
    out = ""
    while True:
        out += chr(ord("a") + i % 26)
        i //= 26
        if not i:
            return "w" + out


WORDS = [_word(i) for i in range(4000)]


def doc(rng: random.Random, n: int = 150) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def edit(text: str, rng: random.Random, share: float) -> str:
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, int(len(words) * share))):
        words[i] = "x" + _word(rng.randrange(10**9))
    return " ".join(words)


def kept_texts(result) -> list[str]:
    return MappedTable(result.path).table.column(0).to_pylist()


def dropped(result) -> list[dict]:
    return datasets.load_from_disk(f"{result.path}/dropped").to_list()


def run(tmp_path, texts, tokenizer_dir, **extra):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts])
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}, **extra))
    return cfg, pipeline.walk(cfg, until="decontaminate" if cfg.decontaminate else "dedup")


def test_exact_copies_go_and_the_first_stays(tmp_path, tokenizer_dir):
    rng = random.Random(0)
    base = [doc(rng) for _ in range(50)]
    texts = [
        *base,
        base[3],
        "  " + base[4].replace(" ", "   ", 5) + "\n",  # whitespace only
        base[5].replace("w1", "ｗ1"),  # full-width letter: the same text after NFKC
        base[6].upper(),  # case is a difference: kept
    ]
    _, res = run(tmp_path, texts, tokenizer_dir, dedup={"exact": True}, keep_dropped=True)
    report = res["dedup"].report
    assert report["dropped"] == {"exact_duplicate": 3}
    assert kept_texts(res["dedup"]) == [*base, base[6].upper()]  # input order, first copies
    rows = dropped(res["dedup"])
    assert [(r["row"], r["reason"], r["detail"]) for r in rows] == [
        (50, "exact_duplicate", "copy of row 3"),
        (51, "exact_duplicate", "copy of row 4"),
        (52, "exact_duplicate", "copy of row 5"),
    ]
    assert rows[1]["text"] == texts[51]


def test_near_copies_are_found_and_verified(tmp_path, tokenizer_dir):
    rng = random.Random(1)
    base = [doc(rng, 300) for _ in range(300)]
    near = [edit(base[i], rng, 0.02) for i in range(40)]  # ~2% of words: Jaccard ≈ 0.82
    far = [edit(base[i], rng, 0.15) for i in range(40, 60)]  # ~15%: Jaccard ≈ 0.3, not a duplicate
    texts = base + near + far
    truth = [
        len(shingle_set(base[i], 5) & shingle_set(t, 5)) / len(shingle_set(base[i], 5) | shingle_set(t, 5))
        for i, t in enumerate(near)
    ]
    assert min(truth) >= 0.8
    _, res = run(tmp_path, texts, tokenizer_dir, dedup={"near": {"threshold": 0.8}}, keep_dropped=True)
    report = res["dedup"].report
    assert report["dropped"] == {"near_duplicate": 40}
    assert (report["near"]["bands"], report["near"]["rows"]) == derive_bands(0.8, 112, verify=True)
    rows = dropped(res["dedup"])
    assert [r["row"] for r in rows] == list(range(300, 340))
    assert all(r["detail"].startswith(f"near copy of row {r['row'] - 300} (Jaccard 0.") for r in rows)


def test_without_verification_candidates_join_as_lsh_finds_them(tmp_path, tokenizer_dir):
    rng = random.Random(2)
    base = [doc(rng, 200) for _ in range(100)]
    texts = base + [edit(base[i], rng, 0.01) for i in range(20)]
    _, res = run(
        tmp_path, texts, tokenizer_dir, dedup={"exact": False, "near": {"bands": 14, "rows": 8, "verify": False}}
    )
    assert res["dedup"].report["dropped"] == {"near_duplicate": 20}
    assert res["dedup"].report["near"]["pairs_checked"] == 0


def test_signatures_agree_with_jaccard():
    """A MinHash signature position agrees with the Jaccard similarity's probability."""
    rng = random.Random(3)
    a = doc(rng, 2000)
    b = edit(a, rng, 0.05)
    j = len(shingle_set(a, 5) & shingle_set(b, 5)) / len(shingle_set(a, 5) | shingle_set(b, 5))
    sig, has = MinHasher(5, 1024, 1, 1024).signatures([a, b, ""])
    assert has.tolist() == [True, True, False]
    assert abs(float(np.mean(sig[0] == sig[1])) - j) < 0.05
    assert candidate_probability(0.8, *derive_bands(0.8, 112, verify=True)) > 0.95


def test_ngrams_do_not_depend_on_the_batch():
    texts = ["Hello, World! one two three four five", "", "학교에서 공부를 했다. 그리고 집에 갔다.", "a b"]
    together = text_ngrams(texts, 3)
    for i, t in enumerate(texts):
        alone = text_ngrams([t], 3).hashes
        assert alone.tolist() == together.hashes[together.offsets[i] : together.offsets[i + 1]].tolist()
    assert together.counts().tolist() == [5, 0, 4, 1]  # a short document: one n-gram of all its words
    assert ngram_set("Hello,  WORLD one", 3) == ngram_set("hello world one!", 3)


def test_exact_keys_normalise_unicode_and_whitespace():
    import pyarrow as pa

    keys = exact_keys(pa.array(["a  b\n", "a b", "ａ b", "A b"]))
    assert first_copies(keys).tolist() == [0, 0, 0, 3]


def test_copies_across_sources_keep_the_earlier_source(tmp_path, tokenizer_dir):
    rng = random.Random(4)
    ko = [doc(rng) for _ in range(30)]
    en = [doc(rng) for _ in range(30)] + [ko[2], edit(ko[7], rng, 0.01)]
    paths = {
        n: write_jsonl(tmp_path / n / "c.jsonl", [{"text": t} for t in texts]) for n, texts in (("ko", ko), ("en", en))
    }
    base = config_dict(tmp_path, paths["ko"], {"path": str(tokenizer_dir)})
    del base["source"]
    base["sources"] = [{"name": n, "path": str(p), "weight": 1} for n, p in paths.items()]
    cfg = parse_config({**base, "dedup": {"near": {}}, "keep_dropped": True})
    names = [n.name for n in pipeline.nodes(cfg)]
    assert names.index("signatures[ko]") < names.index("dedup[en]")
    assert pipeline.node(cfg, "dedup[en]").reads == ("filter[en]", "signatures[en]", "filter[ko]", "signatures[ko]")
    res = pipeline.walk(cfg, until="decontaminate")
    assert res["dedup[ko]"].report["dropped"] == {}
    assert res["dedup[en]"].report["dropped"] == {"exact_duplicate": 1, "near_duplicate": 1}
    details = [r["detail"] for r in dropped(res["dedup[en]"])]
    assert details[0] == "copy of ko row 2" and details[1].startswith("near copy of ko row 7")
    # the first source's dedup has the key a config of that source alone gives it
    alone = parse_config(
        {
            **config_dict(tmp_path, paths["ko"], {"path": str(tokenizer_dir)}),
            "dedup": {"near": {}},
            "keep_dropped": True,
        }
    )
    assert pipeline.walk(alone, until="dedup")["dedup"].key == res["dedup[ko]"].key


def test_signature_units_give_the_stage_output_of_one_run(tmp_path, tokenizer_dir, monkeypatch):
    monkeypatch.setattr(signatures, "ROWS_PER_PART", 70)  # several parts from a small corpus
    rng = random.Random(5)
    texts = [doc(rng, 60) for _ in range(400)]
    texts += texts[:30]
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts])
    outputs = {}
    for n in (1, 3):
        cfg = parse_config(
            {
                **config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}),
                "cache_dir": str(tmp_path / f"cache{n}"),
                "dedup": {"near": {}},
            }
        )
        units = [pipeline.run_units(cfg, "signatures", i, n) for i in reversed(range(n))]
        assert sum(u["built"] for u in units) == 7  # ceil(430 / 70) parts, each built once
        res = pipeline.walk(cfg, until="dedup")
        assert res["signatures"].report["parts_computed_here"] == 0
        assert res["dedup"].report["dropped"] == {"exact_duplicate": 30}
        outputs[n] = store_files(tmp_path / f"cache{n}" / "signatures")
    assert outputs[1] == outputs[3]


def test_the_first_copy_stays_so_dedup_never_drops_every_row(tmp_path, tokenizer_dir):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "same text"}] * 3)
    cfg = parse_config({**config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}), "dedup": {}})
    res = pipeline.walk(cfg, until="dedup")  # the first copy stays: never everything
    assert res["dedup"].report["rows_out"] == 1


def test_evaluation_texts_planted_in_documents_are_caught(tmp_path, tokenizer_dir):
    rng = random.Random(6)
    texts = [doc(rng, 200) for _ in range(200)]
    items = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30))) for _ in range(12)]
    write_jsonl(tmp_path / "evals" / "a.jsonl", [{"question": q, "answer": "x"} for q in items[:6]])
    write_jsonl(tmp_path / "evals" / "b.jsonl", [{"question": q} for q in items[6:]] + [{"question": "too short"}])
    planted = rng.sample(range(200), 12)
    for item, at in zip(items, planted, strict=True):
        words = texts[at].split()
        cut = rng.randrange(len(words))
        texts[at] = " ".join([*words[:cut], item.upper().replace(" ", ",  ", 1) + ".", *words[cut:]])
    _, res = run(
        tmp_path,
        texts,
        tokenizer_dir,
        decontaminate={"path": str(tmp_path / "evals" / "*.jsonl"), "text_field": "question"},
        keep_dropped=True,
    )
    report = res["decontaminate"].report
    assert report["dropped"] == {"contaminated": 12}
    assert report["eval_texts"] == 13 and report["eval_texts_too_short"] == 1
    rows = dropped(res["decontaminate"])
    assert sorted(r["row"] for r in rows) == sorted(planted)
    assert all("evals/" in r["detail"] and ".jsonl:" in r["detail"] for r in rows)


def test_a_missing_evaluation_path_is_one_line_naming_the_setting(tmp_path, tokenizer_dir):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "a b c"}])
    cfg = parse_config(
        {
            **config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}),
            "decontaminate": {"path": str(tmp_path / "nope/*.jsonl")},
        }
    )
    with pytest.raises(DataError, match=r"^decontaminate.path '.*nope/\*.jsonl' matches no files"):
        pipeline.walk(cfg, until="decontaminate")


def test_dedup_settings_are_checked():
    with pytest.raises(ConfigError, match=r"^config: dedup\.near: set both dedup\.near\.bands and"):
        parse_config({"source": {"path": "x"}, "tokenizer": {"path": "t"}, "dedup": {"near": {"bands": 4}}})
    with pytest.raises(ConfigError, match="remove the dedup block"):
        parse_config({"source": {"path": "x"}, "tokenizer": {"path": "t"}, "dedup": {"exact": False}})


def test_no_cleaning_block_keeps_the_keys_of_before(tmp_path, corpus, tokenizer_dir):
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    assert [n.name for n in pipeline.nodes(cfg)][:3] == ["convert", "filter", "save"]
    assert pipeline.node(cfg, "save").reads == ("filter",)


@pytest.mark.slow
def test_verdicts_in_worker_processes_are_those_of_one_process(tmp_path, monkeypatch):
    from moai.clean import rows
    from moai.formats.text import write_text_dataset
    from moai.stages.decontaminate import EvalIndex, judge

    rng = random.Random(7)
    items = [" ".join(rng.choice(WORDS) for _ in range(20)) for _ in range(5)]
    texts = [doc(rng, 50) for _ in range(900)]
    for i in range(0, 900, 97):
        texts[i] += " " + items[i % 5]
    write_text_dataset([texts], tmp_path / "text", "1MB")
    index = EvalIndex([(f"e:{i}", t) for i, t in enumerate(items)], 13)
    monkeypatch.setattr(rows, "MIN_BYTES_PER_WORKER", 1)
    one = list(rows.judge_rows(tmp_path / "text", judge, index, num_proc=1, rows_per_task=100))
    two = list(rows.judge_rows(tmp_path / "text", judge, index, num_proc=2, rows_per_task=100))
    assert [(v.lo, v.hi, v.reasons, v.details) for v in one] == [(v.lo, v.hi, v.reasons, v.details) for v in two]
    assert sum(r is not None for v in one for r in v.reasons) == 10


def test_tokenize_units_compute_the_signatures_first(tmp_path, tokenizer_dir, monkeypatch):
    """One Slurm array (moai tokenize-shard) spreads the dedup signatures too: each unit its share."""
    monkeypatch.setattr(signatures, "ROWS_PER_PART", 50)
    rng = random.Random(8)
    texts = [doc(rng, 40) for _ in range(300)]
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts + texts[:10]])
    cfg = parse_config({**config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}), "dedup": {}})
    units = [pipeline.tokenize_shard(cfg, i, 3) for i in (2, 1, 0)]
    # Unit 2 computes its share (parts 2 and 5 of 7), then its walk reaches the clustering and computes the
    # parts no unit has done yet (run one after another here, the other units find them all done).
    assert [u["signatures"]["built"] for u in units] == [2, 0, 0]
    done = pipeline.merge(cfg, 3)
    signatures_dir = tmp_path / "cache" / "signatures" / done["stages"]["signatures"]["key"]
    assert json.loads((signatures_dir / "_manifest.json").read_text())["report"]["parts_computed_here"] == 5
    assert done["stages"]["dedup"]["dropped"] == {"exact_duplicate": 10}


@pytest.mark.slow
def test_the_cleaning_example_prints_what_its_guide_shows(tmp_path):
    """examples/clean.yaml from a copy of the examples: docs/cleaning.md's lines for the cleaning stages
    (rows in → out and dropped by reason; not the seconds)."""
    import re
    import shutil

    from conftest import ROOT, moai_cli

    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    out = moai_cli("prepare", "examples/clean.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stderr

    def counts(lines):
        return [" ".join(re.sub(r"\s+[\d.]+s\s+[\d.,]+ MB/s$", "", line).split()) for line in lines]

    stages = ("signatures", "dedup", "quality", "language", "decontaminate")
    printed = [line for line in out.stderr.splitlines() if line.split()[1:2] and line.split()[1] in stages]
    guide = (ROOT / "docs" / "cleaning.md").read_text()
    shown = [line for line in guide.splitlines() if re.match(rf"moai: ({'|'.join(stages)}) +built", line)]
    assert len(shown) == 5 and counts(printed) == counts(shown)


@pytest.mark.parametrize(
    "block, says",
    [
        ({"language": {"keep": ["kr"]}}, "language.keep: 'kr' is not a language lid.176 identifies (did you mean ko?)"),
        ({"language": {"keep": ["KO", "en"]}}, "(did you mean ko?)"),
        ({"quality": {"thresholds": {"gopher:word_count": {"min": 500, "max": 100}}}}, "min 500 is above max 100"),
    ],
)
def test_settings_that_would_drop_everything_silently_are_refused(tmp_path, corpus, tokenizer_dir, block, says):
    from moai import preflight

    cfg = parse_config({**config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}), **block})
    with pytest.raises(ConfigError) as err:
        preflight.require(cfg, train=False)
    assert says in str(err.value)


def test_evaluation_fields_are_checked_before_any_stage(tmp_path, corpus, tokenizer_dir):
    from moai import preflight

    evals = write_jsonl(tmp_path / "evals.jsonl", [{"q": "what is the capital of france and why is it there"}] * 2)
    base = config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)})
    cfg = parse_config({**base, "decontaminate": {"path": str(evals), "text_field": "question"}})
    with pytest.raises(DataError, match=r"evals\.jsonl:1: no field 'question' \(decontaminate\.text_field\)"):
        preflight.require(cfg, train=False)
    cfg = parse_config({**base, "decontaminate": {"path": str(evals), "text_field": ["q", "answer"]}})
    with pytest.raises(DataError, match=r"decontaminate\.text_field 'answer': no row of decontaminate\.path"):
        preflight.require(cfg, train=False)
    assert not (tmp_path / "cache").exists()


def test_the_report_names_the_dropped_rows_inside_the_published_folder(tmp_path, tokenizer_dir):
    rng = random.Random(9)
    texts = [doc(rng) for _ in range(20)]
    _, res = run(tmp_path, texts + texts[:2], tokenizer_dir, dedup={}, keep_dropped=True)
    assert res["dedup"].report["dropped_rows"] == "dropped"
    assert len(datasets.load_from_disk(f"{res['dedup'].path}/{res['dedup'].report['dropped_rows']}")) == 2
