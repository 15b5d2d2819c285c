import json

import pytest
import yaml

from moai.config import ConfigError, PipelineConfig, load_config, parse_config, read_env
from moai.presets import PRESETS, resolve_config

ISSUE_EXAMPLE = """
cache_dir: .moai
source:
  path: "data/*.jsonl"
  text_field: text
filter:
  min_chars: 1
tokenizer:
  path: tokenizers/moai
pack:
  enabled: true
  seq_len: 2048
split:
  val_fraction: 0.01
"""


def test_the_documented_keys_load_from_yaml(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(ISSUE_EXAMPLE)
    cfg = load_config(f)
    assert cfg.source.path == "data/*.jsonl" and cfg.pack.seq_len == 2048 and cfg.split.val_fraction == 0.01


def test_json_and_hub_and_template_forms(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(
        json.dumps(
            {
                "source": {
                    "hub": "nvidia/OpenCodeGeneticInstruct",
                    "split": "train",
                    "subset": None,
                    "text_template": "{input}\n{solution}",
                },
                "tokenizer": {"train": {"vocab_size": 32000}},
            }
        )
    )
    cfg = load_config(f)
    assert cfg.source.hub == "nvidia/OpenCodeGeneticInstruct" and cfg.source.text_field is None
    assert cfg.tokenizer.train.vocab_size == 32000


@pytest.mark.parametrize(
    "patch, named",
    [
        ({"source": {"path": "x", "txt_field": "t"}}, "source.txt_field: unknown key"),
        ({"pack": {"seq_length": 5}}, "pack.seq_length: unknown key"),
        ({"bogus": 1}, "bogus: unknown key"),
        ({"pack": {"seq_len": 0}}, "pack.seq_len"),
        ({"split": {"val_fraction": 1.5}}, "split.val_fraction"),
    ],
)
def test_bad_keys_are_named(patch, named):
    data = {"source": {"path": "x"}, "tokenizer": {"path": "t"}}
    for k, v in patch.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        parse_config(data, origin="my.yaml")


@pytest.mark.parametrize(
    "source, message",
    [
        ({}, "exactly one of source.path"),
        ({"path": "a", "hub": "b"}, "exactly one of source.path"),
        ({"path": "a", "text_field": "t", "text_template": "{t}"}, "not both"),
        ({"path": "a", "text_template": "{} and {}"}, "named fields"),
    ],
)
def test_cross_field_rules(source, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"source": source, "tokenizer": {"path": "t"}})


def test_error_names_the_file(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("source: [unclosed")
    with pytest.raises(ConfigError, match=r"broken\.yaml"):
        load_config(f)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")


def test_presets_validate_and_resolve():
    for name, fn in PRESETS.items():
        assert isinstance(fn(), PipelineConfig)
        assert resolve_config(name) == fn()
    with pytest.raises(ConfigError, match="neither a config file nor a preset"):
        resolve_config("no-such-preset")


def test_shipped_example_configs_validate():
    from conftest import ROOT

    files = sorted((ROOT / "examples").glob("*.yaml"))
    assert files, "examples/ should hold at least one config"
    for f in files:
        load_config(f)


def test_env_settings_are_read_and_checked():
    assert read_env({"DATASET_NUM_PROC": "8", "DATASET_BATCH_SIZE": "500", "OTHER": "x"}) == {
        "num_proc": 8,
        "batch_size": 500,
    }
    with pytest.raises(ConfigError, match="DATASET_WRITER_BATCH_SIZE"):
        read_env({"DATASET_WRITER_BATCH_SIZE": "lots"})
    with pytest.raises(ConfigError, match="DATASET_NUM_PROC"):
        read_env({"DATASET_NUM_PROC": "0"})


def test_yaml_round_trip_of_a_preset(tmp_path):
    cfg = PRESETS["tiny"]()
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert load_config(f) == cfg


def _sources(*names, **extra) -> dict:
    return {
        "sources": [{"name": n, "path": f"data/{n}/*.jsonl", "weight": 1.0} for n in names],
        "tokenizer": {"path": "t"},
        **extra,
    }


@pytest.mark.parametrize(
    "data, message",
    [
        ({"tokenizer": {"path": "t"}}, "set exactly one of source .* or sources"),
        ({**_sources("ko"), "source": {"path": "x"}}, "set exactly one of source .* or sources"),
        (_sources("ko", "ko"), r"names must be unique, \['ko'\] repeated"),
        (_sources(), "at least one source"),
        (_sources("ko", pack={"enabled": False}), "with sources the mix stage packs"),
        ({"source": {"path": "x"}, "tokenizer": {"path": "t"}, "mix": {"total_tokens": 5}}, "mix is for sources"),
        ({"sources": [{"name": "ko", "path": "x", "weight": 0}], "tokenizer": {"path": "t"}}, "weight"),
        ({"sources": [{"name": "ko", "path": "x", "weight": 1, "max_repetition": 0.5}], "tokenizer": {"path": "t"}},
         "max_repetition"),
        ({"sources": [{"name": "a b", "path": "x", "weight": 1}], "tokenizer": {"path": "t"}}, "name"),
        ({"sources": [{"name": "ko", "weight": 1}], "tokenizer": {"path": "t"}}, "exactly one of source.path"),
    ],
)  # fmt: skip
def test_sources_rules(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(data)


def test_a_named_source_is_the_source_it_names():
    from moai.sources import source_config

    cfg = parse_config(
        _sources("ko", "code") | {"sources": [{"name": "ko", "path": "k", "weight": 2, "text_template": "{a}"}]}
    )
    one = source_config(cfg, "ko")
    assert (
        one.sources is None
        and one.source
        == parse_config({"source": {"path": "k", "text_template": "{a}"}, "tokenizer": {"path": "t"}}).source
    )


@pytest.mark.parametrize(
    "train, num_gpus, expected",
    [
        ({}, 0, 100 * 8 * 1 * 1 * 128),  # CPU: one process
        ({}, 4, 100 * 8 * 1 * 4 * 128),  # one process per GPU
        ({"num_processes": 2, "num_machines": 3, "main_process_ip": "h"}, 8, 100 * 8 * 2 * 3 * 128),
        ({"max_steps": 7, "micro_batch_size": 3, "grad_accum_steps": 5}, 2, 7 * 3 * 5 * 2 * 128),
    ],
)
def test_the_mix_budget_is_what_training_reads(train, num_gpus, expected):
    from moai.sources import total_tokens

    t = {"model_config": {"model_type": "llama"}, **train}
    cfg = parse_config(_sources("ko", train=t, pack={"seq_len": 128}))
    assert total_tokens(cfg, num_gpus) == (expected, total_tokens(cfg, num_gpus)[1])
    assert "world size" in total_tokens(cfg, num_gpus)[1]
    given = parse_config(_sources("ko", train=t, mix={"total_tokens": 12345}))
    assert total_tokens(given, num_gpus) == (12345, "mix.total_tokens")
    assert total_tokens(parse_config(_sources("ko")))[0] is None  # no train, no total: what the caps allow
