"""The validation estimate from a sample (`moai.estimate`); against real prepare runs on every
example: tests/test_preflight.py::test_the_validation_estimate_is_within_20_percent_on_every_example_or_says_why_not."""

import json

import numpy as np

from conftest import ROOT, config_dict
from moai.config import parse_config
from moai.estimate import SourceSample, packed, sample_source, validation
from moai.stages.convert.readers import source_files

TOKENIZER = {"path": str(ROOT / "examples" / "tokenizer")}


def test_a_sample_of_part_of_a_source_scales_its_rows_by_bytes(tmp_path, corpus):
    config = parse_config(config_dict(tmp_path, corpus, TOKENIZER))
    files = source_files(config.source)
    size = corpus.stat().st_size
    whole = sample_source(files, config.source, config)
    part = sample_source(files, config.source, config, limit=size // 5)
    assert (
        isinstance(whole, SourceSample) and whole.whole and len(whole.lengths) == 1484
    )  # 16 empty texts: filter drops them
    assert isinstance(part, SourceSample) and not part.whole and 250 < len(part.lengths) < 350
    exact, guessed = validation(whole, size, config), validation(part, size, config)
    assert exact.rows == 74 and exact.rough == ()  # round(1484 x 0.05), the rows save chooses
    assert abs(guessed.rows - 74) <= 74 * 0.1, guessed
    assert abs(guessed.tokens - exact.tokens) <= 0.2 * exact.tokens, (guessed, exact)
    assert abs(guessed.samples - exact.samples) <= 0.2 * exact.samples, (guessed, exact)


def test_an_estimate_says_why_it_may_be_far_off(tmp_path, corpus):
    config = parse_config(config_dict(tmp_path, corpus, TOKENIZER, split={"val_fraction": 0.002}))
    files, size = source_files(config.source), corpus.stat().st_size
    part = sample_source(files, config.source, config, limit=size // 5)
    assert isinstance(part, SourceSample)
    (few,) = validation(part, size, config).rough
    assert few.startswith("only ~3 validation rows, drawn from a sample")
    whole = sample_source(files, config.source, config)
    assert isinstance(whole, SourceSample)
    assert validation(whole, size, config).rough == ()  # the very rows save chooses: nothing drawn


def test_a_trained_tokenizer_is_counted_with_one_trained_on_the_sample(tmp_path, corpus):
    config = parse_config(config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}}))
    sample = sample_source(source_files(config.source), config.source, config, limit=corpus.stat().st_size // 5)
    assert isinstance(sample, SourceSample) and sample.trained
    given = sample_source(
        source_files(config.source), config.source, parse_config(config_dict(tmp_path, corpus, TOKENIZER))
    )
    assert isinstance(given, SourceSample) and sample.bytes_per_token != given.bytes_per_token
    assert "counted with one trained on a sample" in " ".join(validation(sample, 10**6, config).rough)


def test_chat_rows_are_counted_as_tokenize_renders_them(tmp_path):
    from moai.stages.tokenize.chat import ChatTokenizer, load_template
    from moai.stages.tokenizer import load_tokenizer

    path = ROOT / "examples" / "chat" / "conversations.jsonl"
    template = str(ROOT / "examples" / "chat" / "template.jinja")
    data = config_dict(tmp_path, path, TOKENIZER)
    data["source"] = {"path": str(path), "format": "chat", "chat_template": template}
    config = parse_config(data)
    sample = sample_source(source_files(config.source), config.source, config)
    assert isinstance(sample, SourceSample) and sample.whole
    tok = load_tokenizer(TOKENIZER["path"])
    chat = ChatTokenizer(tok, load_template(template), tok.eos_token_id)
    rows = [json.loads(line)["messages"] for line in path.read_text().splitlines()]
    assert sample.lengths.tolist() == [len(chat.encode(m)[0]) for m in rows]


def test_packed_counts_concat_windows_and_best_fit_rows(tmp_path, corpus):
    lengths = np.array([100, 30, 200, 64])
    concat = parse_config(config_dict(tmp_path, corpus, TOKENIZER, pack={"seq_len": 64}))
    assert packed(lengths, concat) == 394 // 64
    best_fit = parse_config(config_dict(tmp_path, corpus, TOKENIZER, pack={"seq_len": 64, "mode": "best_fit"}))
    # 100 -> 64 + 36, 200 -> 3 x 64 + 8, 64 whole: 5 full rows; then 36 + 8 in one row, 30 in another
    assert packed(lengths, best_fit) == 7


def test_a_compressed_source_is_sampled_as_convert_reads_it(tmp_path, corpus):
    import gzip

    packed_file = tmp_path / "gz" / "corpus.jsonl"  # gzip bytes under a plain name: convert reads them by magic
    packed_file.parent.mkdir()
    packed_file.write_bytes(gzip.compress(corpus.read_bytes()))
    plain = parse_config(config_dict(tmp_path, corpus, TOKENIZER))
    gz = parse_config(config_dict(tmp_path, packed_file, TOKENIZER))
    a = sample_source(source_files(plain.source), plain.source, plain)
    b = sample_source(source_files(gz.source), gz.source, gz)
    assert isinstance(a, SourceSample) and isinstance(b, SourceSample) and b.whole
    assert b.lengths.tolist() == a.lengths.tolist() and b.bytes_read == a.bytes_read


CLEAN = ROOT / "examples" / "clean.yaml"


def clean_config(tmp_path, **changes):
    """examples/clean.yaml, its paths made absolute, with `changes` to its top-level blocks."""
    import yaml

    data = yaml.safe_load(CLEAN.read_text())
    data["source"]["path"] = str(ROOT / data["source"]["path"])
    data["decontaminate"]["path"] = str(ROOT / data["decontaminate"]["path"])
    data["tokenizer"]["path"] = str(ROOT / data["tokenizer"]["path"])
    data["cache_dir"] = str(tmp_path / "cache")
    return parse_config({**data, **changes})


def test_the_cleaning_stages_own_verdicts_drop_rows_of_the_sample(tmp_path):
    config = clean_config(tmp_path)
    sample = sample_source(source_files(config.source), config.source, config)
    assert isinstance(sample, SourceSample) and sample.whole and sample.rough == ()
    # what `moai prepare examples/clean.yaml` drops, stage by stage (its stage table: 400 -> 345 -> 329 -> 313 -> 305)
    assert sample.dropped == {"dedup": 55, "quality": 16, "language": 16, "decontaminate": 8}
    assert len(sample.lengths) == 305
    alone = sample_source(source_files(config.source), config.source, clean_config(tmp_path, dedup=None))
    assert isinstance(alone, SourceSample) and list(alone.dropped) == ["quality", "language", "decontaminate"]
    assert len(alone.lengths) > 305  # the copies stay


def test_dedup_on_part_of_a_source_says_it_sees_only_the_copies_within_it(tmp_path):
    config = clean_config(tmp_path)
    files = source_files(config.source)
    part = sample_source(files, config.source, config, limit=files[0].stat().st_size // 2)
    assert isinstance(part, SourceSample) and not part.whole and sum(part.dropped.values()) > 0
    assert part.rough == ("dedup on a sample sees only the copies within it",)
    no_dedup = clean_config(tmp_path, dedup=None)
    assert sample_source(files, no_dedup.source, no_dedup, limit=files[0].stat().st_size // 2).rough == ()


def test_chat_rows_with_cleaning_on_say_the_plan_does_not_count_its_drops(tmp_path):
    path = ROOT / "examples" / "chat" / "conversations.jsonl"
    data = config_dict(tmp_path, path, TOKENIZER, quality={"rules": "gopher"})
    data["source"] = {"path": str(path), "format": "chat", "chat_template": str(path.parent / "template.jinja")}
    config = parse_config(data)
    sample = sample_source(source_files(config.source), config.source, config)
    assert isinstance(sample, SourceSample) and sample.dropped == {}  # the stages judge the messages as JSON
    assert validation(sample, path.stat().st_size, config).rough == (
        "quality drop chat rows before the split that the plan does not count",
    )


def test_copies_across_the_sources_of_a_mix_are_said_to_be_left_out(tmp_path):
    from moai import preflight

    data = config_dict(tmp_path, "unused", TOKENIZER, dedup={"exact": True})
    del data["source"]
    data["sources"] = [
        {"name": "ko", "path": str(ROOT / "examples" / "data" / "mix" / "ko.jsonl"), "weight": 1},
        {"name": "en", "path": str(ROOT / "examples" / "data" / "mix" / "en.jsonl"), "weight": 1},
    ]
    (check,) = [c for c in preflight.run(parse_config(data), train=False) if c.name == "validation"]
    assert "cleaning drops 0 of " in check.detail, check.detail  # no copies within either source
    assert check.detail.endswith(
        "; rough: dedup drops copies of earlier sources' rows that each source's sample does not see"
    )


def test_a_source_large_enough_for_many_validation_samples_is_sampled_over_its_first_mib(tmp_path, corpus):
    """With a given tokenizer and no cleaning, a source whose validation split holds MANY_SAMPLES by
    its size alone is sampled over QUICK_SAMPLE_BYTES; a smaller one, one with cleaning on, or one
    whose tokenizer is trained on the sample, over SAMPLE_BYTES."""
    from moai.estimate import MANY_SAMPLES, QUICK_SAMPLE_BYTES, SAMPLE_BYTES, sample_limit
    from moai.preflight import validation_estimate

    config = parse_config(config_dict(tmp_path, corpus, TOKENIZER, split={"val_fraction": 0.01}))
    seq_len = config.pack.seq_len
    large = next(b for b in (10**k for k in range(3, 14)) if validation_estimate(b, 0.01, seq_len)[1] >= MANY_SAMPLES)
    assert sample_limit(large, config) == QUICK_SAMPLE_BYTES < SAMPLE_BYTES
    assert sample_limit(large // 10, config) == SAMPLE_BYTES  # few samples: counted on 4 MiB
    assert sample_limit(large, clean_config(tmp_path)) == SAMPLE_BYTES  # cleaning's drops need the sample
    trained = parse_config(config_dict(tmp_path, corpus, {"train": {"vocab_size": 300}}, split={"val_fraction": 0.01}))
    assert sample_limit(large, trained) == SAMPLE_BYTES
