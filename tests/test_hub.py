"""moai.hub: a missing local path is named as such, and a hub name that cannot be had is one line
within seconds (offline here: an endpoint that refuses connections, and empty caches)."""

import json
import time
from pathlib import Path

import pytest

from moai import hub
from moai.config import parse_config
from moai.errors import ConfigError

OFFLINE_BOUND_S = 5.0  # the bound for anything decidable before reading data; today: 28–50 s of retries


def timed_error(fn, *args):
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        fn(*args)
    return str(err.value), time.monotonic() - started


@pytest.mark.parametrize(
    "value, expected",
    [
        ("./tok", True),
        ("/abs/tok", True),
        ("~/tok", True),
        ("configs/llama-1b.json", True),
        ("a/b/c", True),  # not a repo id
        ("gpt2", False),
        ("Qwen/Qwen3-0.6B", False),  # no folder Qwen here
        ("tokenizers/my-tokenizer", False),  # without a folder `tokenizers`: could be a hub repo
    ],
)
def test_looks_like_path(value, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.looks_like_path(value) is expected


def test_a_path_under_an_existing_folder_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tokenizers").mkdir()
    assert hub.looks_like_path("tokenizers/my-tokenizer")


def test_missing_tokenizer_folder_is_named_in_seconds(tmp_path, monkeypatch, offline_hub):
    from moai.stages.tokenizer import load_tokenizer

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tokenizers").mkdir()
    message, seconds = timed_error(load_tokenizer, "tokenizers/my-tokenizer")
    assert message.startswith("tokenizer.path tokenizers/my-tokenizer: no such folder")
    assert str(tmp_path) in message and "huggingface.co" not in message
    assert seconds < OFFLINE_BOUND_S


def test_owner_name_without_folder_or_hub_says_both(tmp_path, monkeypatch, offline_hub):
    from moai.stages.tokenizer import load_tokenizer

    monkeypatch.chdir(tmp_path)
    message, seconds = timed_error(load_tokenizer, "tokenizers/my-tokenizer")
    assert "no such folder" in message and hub.UNREACHABLE in message
    assert "save_pretrained('my-tokenizer')" in message and "\n" not in message
    assert seconds < OFFLINE_BOUND_S


def test_hub_name_offline_and_not_cached_is_one_line_in_seconds(offline_hub):
    message, seconds = timed_error(hub.resolve, "tokenizer.path", "gpt2")
    assert message.startswith(f"tokenizer.path gpt2: {hub.UNREACHABLE}; run python -c")
    assert seconds < OFFLINE_BOUND_S
    # asked once per process: the second name does not pay the timeout again
    message, _ = timed_error(hub.resolve, "train.model_config", "Qwen/Qwen3-0.6B")
    assert "AutoConfig.from_pretrained('Qwen/Qwen3-0.6B').save_pretrained('Qwen3-0.6B')" in message
    assert "train.model_config: Qwen3-0.6B/config.json" in message


def test_hub_offline_variable_is_honoured(monkeypatch, offline_hub):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "_head", lambda url: pytest.fail("HF_HUB_OFFLINE: no request"))
    message, _ = timed_error(hub.resolve, "tokenizer.path", "gpt2")
    assert "HF_HUB_OFFLINE is set" in message


def cache_model(hub_cache: Path, repo: str, files: dict[str, str]) -> None:
    """What huggingface_hub leaves after a download: refs/main naming a snapshot with the files."""
    root = hub_cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("abc123")
    snap = root / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)


def test_cached_hub_name_resolves_offline_and_loads_local_only(offline_hub):
    cache_model(offline_hub, "org/tiny", {"config.json": json.dumps({"max_position_embeddings": 256})})
    found = hub.resolve("train.model_config", "org/tiny")
    assert found.where == "cache" and found.local_files_only


def test_cached_config_gives_max_position_embeddings(offline_hub):
    from moai.train.model import model_config_dict

    cache_model(offline_hub, "org/tiny", {"config.json": json.dumps({"max_position_embeddings": 256})})
    t = parse_config({"source": {"path": "x"}, "tokenizer": {"path": "t"}, "train": {"model_config": "org/tiny"}}).train
    assert model_config_dict(t) == ("train.model_config", {"max_position_embeddings": 256})


@pytest.mark.parametrize(
    "status, where",
    [(200, "hub"), (404, None), (401, None), (503, "hub")],  # 5xx: let the loader try
)
def test_what_the_hub_answers(status, where, monkeypatch, offline_hub):
    monkeypatch.setattr(hub, "_head", lambda url: status)
    if where is None:
        message, _ = timed_error(hub.resolve, "tokenizer.path", "nobody/nothing")
        assert "no such model on huggingface.co" in message and "hf auth login" in message
    else:
        assert hub.resolve("tokenizer.path", "nobody/nothing").where == where


def test_missing_model_config_file(tmp_path, monkeypatch, offline_hub):
    from moai.train.model import model_config_dict

    monkeypatch.chdir(tmp_path)
    t = parse_config(
        {"source": {"path": "x"}, "tokenizer": {"path": "t"}, "train": {"model_config": "configs/llama-1b.json"}}
    ).train
    message, seconds = timed_error(model_config_dict, t)
    assert message.startswith(f"train.model_config configs/llama-1b.json: no such file (relative to {tmp_path})")
    assert seconds < OFFLINE_BOUND_S


def test_offline_hub_dataset_fix_uses_split(offline_hub):
    from moai.stages.convert import source_fingerprint

    source = parse_config(
        {"source": {"hub": "nobody/some-data", "split": "test", "subset": "en"}, "tokenizer": {"path": "t"}}
    ).source
    message, seconds = timed_error(source_fingerprint, source)
    assert message.startswith(f"source.hub nobody/some-data: {hub.UNREACHABLE}")
    # with split=, load_dataset returns a Dataset, which has to_json (a DatasetDict has not)
    assert "load_dataset('nobody/some-data', 'en', split='test').to_json('some-data.jsonl')" in message
    assert "set source.path: some-data.jsonl" in message
    assert seconds < OFFLINE_BOUND_S


def test_cached_hub_dataset_is_found(offline_hub, tmp_path):
    built = tmp_path / "hf-datasets" / "nobody___some_data" / "default" / "0.0.0"
    built.mkdir(parents=True)
    assert hub.in_cache("nobody/SomeData", "dataset")
    assert hub.resolve("source.hub", "nobody/SomeData", "dataset").where == "cache"
