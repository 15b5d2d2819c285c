"""The UI renderers are pure: plain data in, rows or markdown out (no Prefect needed)."""

from __future__ import annotations

from flows import artifacts
from moai.config import parse_config
from moai.pipeline import StageResult


def _results() -> dict[str, StageResult]:
    report = {"rows_in": 3000, "rows_out": 2994, "dropped": {"empty": 6}, "seconds": 0.5}
    return {
        "convert": StageResult(
            "convert", "k1", "/c/convert/k1", {"rows_in": 3000, "rows_out": 3000, "seconds": 6.4}, True
        ),
        "filter": StageResult("filter", "k2", "/c/filter/k2", report, False),
        "tokenizer": StageResult("tokenizer", "k3", "/c/tokenizer/k3", {"documents": 2844, "vocab_size": 776}, True),
        "tokenize": StageResult(
            "tokenize", "k4", "/c/tokenize/k4", {"rows_in": 2994, "tokens": 161699, "tokens_per_s": 132490.8}, True
        ),
    }


def test_numbers_read_as_a_person_writes_them():
    assert artifacts.number(161699) == "161,699" and artifacts.number(0.0003051371575761435) == "3.05e-04"
    assert artifacts.number(3.14159) == "3.142" and artifacts.number(132490.8) == "132,491"
    assert artifacts.number(None) == "—" and artifacts.number(True) == "yes"
    assert artifacts.value({"empty": 6, "too_long": 1200}) == "empty 6, too_long 1,200"
    assert artifacts.value({}) == "none"
    assert artifacts.duration(5.25) == "5.2 s" and artifacts.duration(185) == "3 min 05 s"
    assert artifacts.duration(7500) == "2 h 05 min" and artifacts.duration(None) == "—"


def test_overview_rows_are_in_pipeline_order_and_say_built_or_reused():
    rows = artifacts.overview_rows(_results())
    assert [r["stage"] for r in rows] == ["convert", "filter", "tokenizer", "tokenize"]
    convert, filt, tokenizer, tokenize = rows
    assert convert["status"] == "built" and filt["status"] == "reused"
    assert filt["rows in → out"] == "3,000 → 2,994" and filt["dropped"] == "empty 6"
    assert filt["seconds"] == "—" and filt["throughput"] == "—"
    assert convert["throughput"] == "469 rows/s" and tokenize["throughput"] == "132k tokens/s"
    assert tokenize["tokens"] == "161,699" and tokenizer["rows in → out"] == "2,844"
    assert convert["output"] == "/c/convert/k1"  # the path as text: no file:// link


def test_overview_markdown_has_the_table_then_each_stage_and_hints_at_a_small_vocabulary():
    cfg = parse_config({"source": {"path": "x"}, "tokenizer": {"train": {"vocab_size": 2048}}})
    md = artifacts.overview_markdown(_results(), cfg)
    assert md.startswith("# Data stages: 3 built, 1 reused")
    assert "| stage | status | rows in → out |" in md and "file://" not in md
    assert md.index("### convert") < md.index("### filter") < md.index("### tokenizer")
    assert "vocab size: 776 (2,048 asked" in md
    assert "reused from the cache: `/c/filter/k2`" in md and "built in this run: `/c/convert/k1`" in md


def test_overview_of_a_data_only_run_says_nothing_is_trained():
    from moai.presets import tiny

    cfg = parse_config({"source": {"path": "x"}, "tokenizer": {"train": {"vocab_size": 2048}}})
    assert "No training in this run (no train section)" in artifacts.overview_markdown(_results(), cfg)
    off = tiny().model_copy(update={"train": tiny().train.model_copy(update={"enabled": False})})
    assert "No training in this run (train.enabled is false)" in artifacts.overview_markdown(_results(), off)
    assert "No training" not in artifacts.overview_markdown(_results(), tiny())


def test_packing_histogram_gives_empty_buckets_no_bar_and_small_ones_a_visible_one():
    hist = [
        {"from": 1, "to": 64, "documents": 3000},
        {"from": 65, "to": 128, "documents": 0},
        {"from": 129, "to": None, "documents": 3},
    ]
    report = {
        "seq_len": 64,
        "splits": {
            "train": {
                "samples": 5,
                "tokens_used": 320,
                "tokens": 330,
                "fraction_used": 0.97,
                "documents_split": 4,
                "documents": 3003,
                "mean_document_tokens": 10,
                "length_histogram": hist,
            }
        },
    }
    md = artifacts.packing_markdown(StageResult("pack", "k", "/p", report, True))
    assert "| 1–64 | 3,000 | " + "█" * 30 + " |" in md and "| 65–128 | 0 |  |" in md and "| 129–∞ | 3 | █ |" in md
    assert "97.00%" in md and "5 × 64 tokens" in md


def test_markdown_table_escapes_pipes():
    assert artifacts.markdown_table([{"a": "x|y", "b": "1"}]) == "| a | b |\n|---|---|\n| x\\|y | 1 |"


def test_the_mix_table_gives_each_source_its_target_and_realised_tokens(tmp_path, tokenizer_dir):
    from conftest import write_jsonl
    from mixed_sources import source_texts
    from moai.pipeline import walk

    sources = [
        {"name": n, "path": str(write_jsonl(tmp_path / f"{n}.jsonl", [{"text": t} for t in source_texts(n, 100)])),
         "weight": w, "max_repetition": 2}
        for n, w in (("ko", 0.6), ("code", 0.3), ("en", 0.1))
    ]  # fmt: skip
    cfg = parse_config(
        {"cache_dir": str(tmp_path / "cache"), "sources": sources, "tokenizer": {"path": str(tokenizer_dir)},
         "pack": {"seq_len": 32}, "mix": {"total_tokens": 100 * 32}}
    )  # fmt: skip
    results = walk(cfg)
    page = artifacts.overview_markdown(results, cfg)
    assert "| convert[ko] | built |" in page and "#### Mix (train split)" in page
    assert "- budget: 3,200 tokens, 100 samples (mix.total_tokens)" in page
    table = page.split("#### Mix (train split)")[1]
    assert "| ko | 0.6 (60.00%) |" in table and "| 1,920 | 1,920 | 60.00% | 60 |" in table
    assert "| en | 0.1 (10.00%) |" in table and "| 320 | 320 | 10.00% | 10 |" in table
    assert artifacts.artifact_key("tokenize[Ko_v2.1]-progress") == "tokenize-ko-v2-1-progress"  # Prefect's rule


def test_the_spikes_card_names_each_spikes_documents_by_file_and_row():
    spikes = [
        {
            "step": 1200,
            "loss": 7.5,
            "jump": 4.25,
            "num_documents": 14,
            "documents": [
                {"source": "web", "where": "data/a.jsonl:17", "tokens": 1900, "preview": "zzzz\nzzzz | zz"},
                {"source": "code", "where": "data/b.parquet:row 3", "tokens": 148, "preview": "def f(x):"},
                {"source": "code", "where": "data/c.jsonl:2", "tokens": 90, "preview": "def __init__(self, *a): <b>"},
            ],
        }
    ]
    md = artifacts.spikes_markdown(spikes)
    assert "## Step 1,200: loss 7.5000 (+4.2500)" in md and "14 documents in the batch" in md
    assert "`data/a.jsonl:17`" in md and "`data/b.parquet:row 3`" in md and "1,900" in md
    assert "zzzz zzzz \\| zz" in md  # newlines folded, pipes escaped: one table row per document
    # corpus text is shown as it is: no bold "init", no italics, no HTML from it
    assert "def \\_\\_init\\_\\_(self, \\*a): \\<b\\>" in md
    assert "No logged loss yet" in artifacts.spikes_markdown([])
