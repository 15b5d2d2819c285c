"""The UI renderers are pure: plain data in, rows or markdown out (no Prefect needed)."""

from __future__ import annotations

import json

from flows import artifacts
from moai.pipeline import StageResult


def test_report_rows_say_where_the_output_is_and_whether_it_was_built():
    r = StageResult(
        "filter",
        "k",
        "/c/filter/k",
        {"rows_in": 10, "rows_out": 8, "dropped": {"empty": 2}, "splits": {"x": 1}},
        built=False,
    )
    rows = {row["field"]: row["value"] for row in artifacts.report_rows(r)}
    assert rows["rows_in"] == "10" and rows["dropped"] == '{"empty": 2}' and "splits" not in rows
    assert rows["output"] == "/c/filter/k" and rows["built now"] == "False"


def test_packing_markdown_shows_non_empty_buckets_only():
    hist = [
        {"from": 1, "to": 64, "documents": 30},
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
                "documents": 33,
                "mean_document_tokens": 10,
                "length_histogram": hist,
            }
        },
    }
    md = artifacts.packing_markdown(StageResult("pack", "k", "/p", report, True))
    assert "| 1–64 | 30 | " + "█" * 30 + " |" in md and "65–128" not in md and "| 129–∞ | 3 |" in md
    assert "97.00%" in md and "5 × 64 tokens" in md


def test_loss_curve_from_metrics_lines(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text(
        "\n".join(
            json.dumps(r) for r in [{"event": "start", "step": 0}, {"step": 10, "loss": 5.0}, {"step": 20, "loss": 3.0}]
        )
    )
    md = artifacts.loss_curve_markdown(f)
    assert "| 10 | 5.0000 |" in md and "| 20 | 3.0000 |" in md and "step 10 … 20" in md
    f.write_text(json.dumps({"event": "start", "step": 0}))
    assert "no loss lines yet" in artifacts.loss_curve_markdown(f)


def test_summary_and_training_rows():
    out = {"token_store": "/t", "sample_index": "/s", "num_documents": 1234, "num_tokens": 56789}
    assert "- tokens: 56,789" in artifacts.summary_markdown(out)
    rows = artifacts.train_rows({"step": 40, "loss": 3.9})
    assert rows[0] == {"metric": "step", "value": "40"} and {"metric": "eval_loss", "value": "None"} in rows
