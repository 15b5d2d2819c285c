"""The quality and language stages in a run: code kept without being judged, and counted where users look."""

from __future__ import annotations

import random

from conftest import config_dict, load_clean_corpus, write_jsonl
from moai.config import parse_config
from moai.pipeline import prepare
from moai.report import stage_table


def test_code_exempt_is_counted_in_the_summary_and_the_stage_table(tmp_path, tokenizer_dir):
    gen, rng = load_clean_corpus(), random.Random(4)
    records = [gen.instruction_record(rng)[1] for _ in range(30)]  # instruction + Python solution
    prose = [gen.en_prose(rng) for _ in range(10)] + [gen.ko_prose(rng) for _ in range(10)]
    junk = ["Home | About | Contact | Login | Cart\n" * 12, "buy cheap best deal " * 40]
    texts = records + prose + junk
    corpus = write_jsonl(tmp_path / "data.jsonl", [{"text": t} for t in texts])
    quality_and_language = {"quality": {"rules": "gopher"}, "language": {"keep": ["ko", "en"]}}
    cfg = config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}, **quality_and_language)
    stages = prepare(parse_config(cfg), progress=False)["stages"]
    quality, language = stages["quality"], stages["language"]
    # every record and every prose document is kept, the junk is dropped; the records are counted
    assert quality["rows_out"] == len(records) + len(prose) and sum(quality["dropped"].values()) == len(junk)
    assert quality["counts"] == {"code_exempt": len(records)}
    assert language["rows_out"] == language["rows_in"] and language["counts"] == {"code_exempt": len(records)}
    shown = f"code_exempt {len(records)}"
    assert [line.split()[0] for line in stage_table(stages) if shown in line] == ["quality", "language"]
