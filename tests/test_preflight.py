"""moai.preflight: mistakes decidable from the config are found before anything runs, by `moai
plan`, `moai doctor` and at the start of prepare/train; `evaluate` is tested with made-up facts."""

import json
import logging
import time

import pytest
import yaml

from conftest import ROOT, config_dict, read_only, write_jsonl
from moai import preflight
from moai.cli import main
from moai.config import parse_config
from moai.errors import ConfigError, DataError
from moai.stages.pack import empty_validation

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 256}


def write_config(tmp_path, corpus, tokenizer=None, **extra):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, tokenizer or {"train": {"vocab_size": 400}}, **extra)))
    return str(cfg)


def plan_cli(cfg, capsys):
    started = time.monotonic()
    code = main(["plan", cfg])
    captured = capsys.readouterr()
    return code, captured, time.monotonic() - started


def test_plan_names_a_missing_tokenizer_folder_in_seconds(tmp_path, corpus, capsys, monkeypatch, offline_hub):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tokenizers").mkdir()
    cfg = write_config(tmp_path, corpus, tokenizer={"path": "tokenizers/my-tokenizer"})
    code, out, seconds = plan_cli(cfg, capsys)
    assert code == 2
    (line,) = out.err.strip().splitlines()
    assert line.startswith("moai: error: tokenizer.path tokenizers/my-tokenizer: no such folder")
    assert seconds < 5.0


def test_plan_names_a_missing_model_config(tmp_path, corpus, capsys, monkeypatch, offline_hub):
    monkeypatch.chdir(tmp_path)
    cfg = write_config(tmp_path, corpus, train={"model_config": "configs/llama-1b.json"})
    code, out, seconds = plan_cli(cfg, capsys)
    assert code == 2
    (line,) = out.err.strip().splitlines()
    assert line.startswith("moai: error: train.model_config configs/llama-1b.json: no such file")
    assert seconds < 5.0


def test_plan_refuses_seq_len_above_the_models_positions(tmp_path, corpus, capsys):
    model = tmp_path / "model.json"
    model.write_text(json.dumps(LLAMA))
    cfg = write_config(tmp_path, corpus, pack={"seq_len": 512}, train={"model_config": str(model)})
    code, out, _ = plan_cli(cfg, capsys)
    assert code == 2
    assert "pack.seq_len 512 is above the model's max_position_embeddings 256" in out.err
    assert "lower pack.seq_len to at most 256" in out.err


def test_plan_prints_its_checks(tmp_path, corpus, capsys):
    cfg = write_config(tmp_path, corpus, train={"model_config": LLAMA})
    code, out, _ = plan_cli(cfg, capsys)
    assert code == 0, out.err
    checks = out.out.split("# checks")[1]
    for name in ("source", "train.model_config", "cache_dir", "space for data", "pack.seq_len", "validation"):
        assert f"pass  {name}" in checks
    assert not (tmp_path / "cache").exists()  # the write probe leaves nothing


def test_prepare_checks_the_source_before_any_stage(tmp_path, corpus, capsys):
    cfg = write_config(tmp_path, tmp_path / "nothing-*.jsonl")
    assert main(["prepare", cfg]) == 2
    assert "source.path" in capsys.readouterr().err and not (tmp_path / "cache").exists()


def test_init_from_folder_config_is_read(tmp_path, corpus):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps({**LLAMA, "max_position_embeddings": 32}))
    data = config_dict(
        tmp_path,
        corpus,
        {"train": {"vocab_size": 400}},
        train={"mode": "continue", "init_from": str(tmp_path / "base")},
    )
    checks = preflight.run(parse_config(data))
    (c,) = [c for c in checks if c.name == "pack.seq_len"]
    assert c.status == "fail" and "max_position_embeddings 32" in c.detail


def test_require_raises_the_first_failure_and_logs_warnings(tmp_path, caplog):
    small = write_jsonl(tmp_path / "small.jsonl", [{"text": "a few words"}] * 20)
    data = config_dict(tmp_path, small, {"train": {"vocab_size": 400}}, pack={"seq_len": 2048})
    with caplog.at_level(logging.WARNING, logger="moai.preflight"):
        preflight.require(parse_config(data))
    assert "likely 0 validation samples" in caplog.text
    data["source"]["path"] = str(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="matches no files"):
        preflight.require(parse_config(data))


def test_an_unwritable_cache_dir_is_one_line(tmp_path, corpus):
    locked = tmp_path / "locked"
    locked.mkdir()
    with read_only(locked):  # chmod, or chattr +i as root (root ignores modes)
        data = config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}}, cache_dir=str(locked / "cache"))
        with pytest.raises(ConfigError, match="is not writable"):
            preflight.require(parse_config(data))


def test_a_cache_dir_under_a_file_is_one_line(tmp_path, corpus):
    (tmp_path / "afile").write_text("")
    data = config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}}, cache_dir=str(tmp_path / "afile" / "cache"))
    with pytest.raises(ConfigError, match=r"cache_dir .*afile/cache is not writable \(NotADirectoryError"):
        preflight.require(parse_config(data))


def facts(tmp_path, **kw) -> preflight.Facts:
    data = config_dict(tmp_path, "x.jsonl", {"train": {"vocab_size": 400}}, train={"model_config": LLAMA})
    base = dict(
        config=parse_config(data),
        corpus_bytes=10_000_000,
        num_files=1,
        cache_dir="/c",
        free_gb=100.0,
        train_checked=True,
        model_setting="train.model_config",
        model_config=LLAMA,
    )
    base.update(kw)
    return preflight.Facts(**base)


def status(checks, name):
    (c,) = [c for c in checks if c.name == name]
    return c.status


@pytest.mark.parametrize(
    "change, name, expected",
    [
        ({}, "space for data", "pass"),
        ({"free_gb": 0.025}, "space for data", "warn"),  # 25 MB: enough to convert 10 MB, not the whole cache
        ({"free_gb": 0.015}, "space for data", "fail"),  # under 2× the source
        ({"free_gb": 0.015, "cache_has_entries": True}, "space for data", "warn"),  # a rerun may reuse it all
        ({"cache_write_error": "PermissionError: Permission denied"}, "cache_dir", "fail"),
        ({"model_config": {**LLAMA, "max_position_embeddings": 32}}, "pack.seq_len", "fail"),
        ({"corpus_bytes": 500}, "validation", "warn"),
        ({"errors": {"source": DataError("source.path 'x' matches no files")}}, "source", "fail"),
    ],
)
def test_each_decision(tmp_path, change, name, expected):
    checks = preflight.evaluate(facts(tmp_path, **change))
    assert status(checks, name) == expected
    if expected == "fail":
        with pytest.raises((ConfigError, DataError)) as err:
            preflight.first_failure(checks)
        assert "\n" not in str(err.value)


def test_space_failure_names_the_numbers(tmp_path):
    checks = preflight.evaluate(facts(tmp_path, free_gb=0.015))
    (c,) = [c for c in checks if c.name == "space for data"]
    assert "0.01 GB free on cache_dir /c" in c.detail and "~20.0 MB" in c.detail and "10.0 MB source" in c.detail


@pytest.mark.parametrize(
    "corpus_bytes, val_fraction, seq_len, expected",
    [(1_000_000, 0.01, 128, (2500, 19)), (1_000_000, 0.01, 4096, (2500, 0)), (None, 0.01, 128, None), (10, 0, 8, None)],
)
def test_validation_estimate(corpus_bytes, val_fraction, seq_len, expected):
    assert preflight.validation_estimate(corpus_bytes, val_fraction, seq_len) == expected


def test_pack_reports_an_empty_validation_split():
    splits = {
        "train": {"samples": 10, "documents": 50, "tokens": 700},
        "validation": {"samples": 0, "documents": 3, "tokens": 40},
    }
    (warning,) = empty_validation(splits, 64)
    assert "3 document(s), 40 tokens" in warning and "pack.seq_len=64" in warning
    splits["validation"]["samples"] = 1
    assert empty_validation(splits, 64) == []
    assert (
        empty_validation({"train": splits["train"], "validation": {"samples": 0, "documents": 0, "tokens": 0}}, 64)
        == []
    )


def test_each_of_several_sources_is_checked_by_name(tmp_path, corpus):
    data = {
        "cache_dir": str(tmp_path / "cache"),
        "sources": [
            {"name": "ko", "path": str(corpus), "weight": 0.7},
            {"name": "en", "path": str(tmp_path / "missing-*.jsonl"), "weight": 0.3},
        ],
        "tokenizer": {"train": {"vocab_size": 400}},
    }
    checks = {c.name: c for c in preflight.run(parse_config(data))}
    assert checks["sources.ko"].status == "pass" and "1 file(s)" in checks["sources.ko"].detail
    assert checks["sources.en"].status == "fail" and checks["sources.en"].detail.startswith("sources.en: ")
    assert "missing-*.jsonl" in checks["sources.en"].detail
    assert "as many tokens as every source's max_repetition allows" in checks["mix.total_tokens"].detail
    with pytest.raises(DataError, match=r"^sources\.en: "):
        preflight.require(parse_config(data))
    assert not (tmp_path / "cache").exists()


def test_cleaning_mistakes_fail_before_any_stage(tmp_path, corpus, capsys):
    """An unknown quality rule or an evaluation path that matches nothing: one line, no stage built."""
    cfg = write_config(tmp_path, corpus, quality={"rules": ["gopher:wordcount"]})
    assert main(["prepare", cfg]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unknown rule 'gopher:wordcount' (did you mean gopher:word_count?)" in line
    cfg = write_config(tmp_path, corpus, decontaminate={"path": str(tmp_path / "evals/*.jsonl")})
    assert main(["prepare", cfg]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("moai: error: decontaminate.path ") and "matches no files" in line
    assert not (tmp_path / "cache").exists()
    cfg = write_config(tmp_path, corpus, dedup={"near": {}}, language={"keep": ["ko", "en"]})
    code, out, _ = plan_cli(cfg, capsys)
    assert code == 0, out.err
    assert (
        "pass  dedup           exact copies and near copies at Jaccard ≥ 0.8 (MinHash 112, 16 bands × 7 rows)"
        in out.out
    )
    assert "pass  language        keep ko, en at score ≥ 0.65" in out.out


@pytest.mark.parametrize("content", [None, "{not json"])
def test_plan_and_prepare_check_the_tokenizer_folder_before_any_stage(tmp_path, corpus, capsys, content):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text("{}")
    if content is not None:
        (folder / "tokenizer.json").write_text(content)
    cfg = write_config(tmp_path, corpus, tokenizer={"path": str(folder)})
    code, out, _ = plan_cli(cfg, capsys)
    assert code == 2
    (line,) = out.err.strip().splitlines()
    says = "has no tokenizer.json" if content is None else "cannot be loaded by `tokenizers`"
    assert line.startswith(f"moai: error: tokenizer.path {str(folder)!r}") and says in line, line
    assert main(["prepare", cfg, "--no-progress"]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "cache" / "convert").exists()  # nothing ran


def test_independent_mistakes_are_reported_together_one_line_each(tmp_path, corpus, capsys):
    model = tmp_path / "model.json"
    model.write_text(json.dumps(LLAMA))
    cfg = write_config(
        tmp_path,
        corpus,
        tokenizer={"path": str(tmp_path / "no-such-tokenizer")},
        pack={"seq_len": 512},
        train={"model_config": str(model)},
    )
    code, out, _ = plan_cli(cfg, capsys)
    assert code == 2
    lines = out.err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("moai: error: ") for line in lines), lines
    assert "tokenizer.path" in lines[0] and "pack.seq_len 512 is above" in lines[1]


def test_a_finished_or_foreign_output_dir_fails_together_with_the_other_checks(tmp_path):
    foreign = preflight.Check("train.output_dir", "fail", "made with other settings", error=ConfigError("other run"))
    checks = preflight.evaluate(facts(tmp_path, model_config={**LLAMA, "max_position_embeddings": 32}, resume=foreign))
    with pytest.raises(preflight.Mistakes) as err:
        preflight.first_failure(checks)
    assert str(err.value).splitlines() == [
        str(next(c.error for c in checks if c.name == "pack.seq_len")),
        "other run",
    ]


EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("example", [*EXAMPLES, "tiny"])
def test_the_validation_estimate_is_within_20_percent_on_every_example_or_says_why_not(tmp_path, monkeypatch, example):
    """Every shipped config and the tiny preset: plan's validation samples against prepare's. A
    hub dataset is not estimated (its size is known after convert). The cleaning stages' drops are
    counted on the sample (examples/clean.yaml: the whole source, so exactly the rows prepare keeps)."""
    import re
    import shutil

    from moai.pipeline import prepare
    from moai.presets import resolve_config
    from moai.stages.chain import CHAIN

    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    config = resolve_config(example if example == "tiny" else f"examples/{example}")
    if any(src.hub is not None for _, src in preflight.source_settings(config)):
        (check,) = preflight._validation_checks(preflight.Facts(config=config))  # no hub reached: no network
        assert check.detail.startswith("not estimated: source is a hub dataset"), check.detail
        return
    (check,) = [c for c in preflight.run(config, train=False) if c.name == "validation"]
    estimated = int(re.match(r"~(\d+) validation sample", check.detail).group(1))
    result = prepare(config, progress=False)
    real = result["num_samples"]["validation"]
    assert "; rough: " not in check.detail and abs(estimated - real) <= 0.2 * real, (estimated, real, check.detail)
    cleaning = [name for name, is_on in CHAIN[1:] if is_on(config)]
    if cleaning:  # each stage's drops counted on the sample: here the whole source, so exactly prepare's
        dropped = sum(result["stages"][name]["rows_in"] - result["stages"][name]["rows_out"] for name in cleaning)
        assert f"cleaning drops {dropped} of {result['stages']['filter']['rows_out']} sampled rows" in check.detail


def test_a_tracker_whose_library_is_missing_fails_before_any_stage(tmp_path, corpus, monkeypatch):
    from moai.train import tracking

    data = config_dict(tmp_path, corpus, {"train": {"vocab_size": 400}}, train={"model_config": LLAMA})
    data["train"]["tracker"] = "wandb"
    config = parse_config(data)
    assert status(preflight.run(config, tokenizer=False), "train.tracker") == "pass"  # installed by the dev extras
    # as on a machine without it: the module name it looks for is one that no machine has
    monkeypatch.setitem(tracking.TRACKER_MODULES, "wandb", "wandb_is_not_installed_here")
    with pytest.raises(ConfigError) as err:
        preflight.require(config)
    assert str(err.value).startswith("train.tracker wandb needs the wandb_is_not_installed_here package")
    assert "pip install 'moai[track]'" in str(err.value) and not (tmp_path / "cache" / "convert").exists()
