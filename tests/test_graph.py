"""The stage graph is declared once: a stage added through the registry alone runs, caches,
and shows in the Prefect flow, without touching flows/ or the CLI."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conftest import DATA_STAGES, config_dict, task_states
from moai import pipeline
from moai.config import parse_config
from moai.formats.tokens import TokenStore


def _count_build(ctx, out):
    store = TokenStore(ctx.path("tokenize"))
    counts = {s: store.split(s).num_documents for s in store.splits}
    (out / "counts.json").write_text(json.dumps(counts))
    return {"rows_in": sum(counts.values()), "rows_out": len(counts), "seconds": 0.0}


# A made-up stage, declared the way every stage module declares itself.
DOCUMENT_COUNT = SimpleNamespace(
    NAME="document-count", VERSION=1, READS=("tokenize",), settings=lambda config: {}, build=_count_build
)


@pytest.fixture
def extra_stage():
    stage = pipeline.Stage.of(DOCUMENT_COUNT)
    pipeline.register(stage)
    yield stage
    pipeline.REGISTRY.remove(stage)


def test_the_registry_lists_the_pipeline_in_order():
    from moai.presets import tiny

    assert [s.name for s in pipeline.stages(tiny())] == ["convert", "filter", "save", "tokenizer", "tokenize", "pack"]
    no_pack = tiny().model_copy(update={"pack": tiny().pack.model_copy(update={"enabled": False})})
    assert "pack" not in [s.name for s in pipeline.stages(no_pack)]


def test_keys_chain_from_what_a_stage_reads(tmp_path, corpus, tokenizer_dir):
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    roots = pipeline.roots(cfg)
    assert set(roots) == {"source", "tokenizer-files"}  # a given tokenizer chains from its files
    k = pipeline.key_of(cfg, "convert", {"source": roots["source"]})
    assert k == pipeline.key_of(cfg, "convert", {"source": roots["source"]})
    assert k != pipeline.key_of(cfg, "convert", {"source": "files:other"})


def test_a_stage_added_through_the_registry_runs_and_caches(extra_stage, tmp_path, corpus, tokenizer_dir):
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    first = pipeline.prepare(cfg, progress=False)
    assert first["stages"]["document-count"]["built"]
    folder = tmp_path / "cache" / "document-count" / first["stages"]["document-count"]["key"]
    assert json.loads((folder / "counts.json").read_text())["train"] > 0
    again = pipeline.prepare(cfg, progress=False)
    assert not any(s["built"] for s in again["stages"].values())


@pytest.mark.slow
def test_a_stage_added_through_the_registry_shows_in_the_flow(
    extra_stage, prefect_server, pretrain, tmp_path, corpus, tokenizer_dir
):
    cfg = parse_config(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}))
    expected = DATA_STAGES | {"document-count"}
    first = pretrain(cfg, return_state=True)
    assert first.is_completed(), first
    assert task_states(first, expected)["document-count"] == "Completed"
    second = pretrain(cfg, return_state=True)
    assert task_states(second, expected)["document-count"] == "Cached"


def test_a_stage_name_is_registered_once(extra_stage):
    with pytest.raises(ValueError, match="'document-count' is registered already"):
        pipeline.register(pipeline.Stage.of(DOCUMENT_COUNT))


@pytest.mark.slow
def test_several_sources_show_a_task_per_source_in_the_flow(prefect_server, pretrain, tmp_path, tokenizer_dir):
    from conftest import write_jsonl
    from mixed_sources import source_texts

    sources = [
        {"name": n, "path": str(write_jsonl(tmp_path / f"{n}.jsonl", [{"text": t} for t in source_texts(n, 60)])),
         "weight": w, "max_repetition": 3}
        for n, w in (("ko", 0.7), ("en", 0.3))
    ]  # fmt: skip
    cfg = parse_config(
        {"cache_dir": str(tmp_path / "cache"), "sources": sources, "tokenizer": {"path": str(tokenizer_dir)},
         "pack": {"seq_len": 32}, "mix": {"total_tokens": 50 * 32}}
    )  # fmt: skip
    nodes = {f"{s}[{n}]" for s in ("convert", "filter", "save", "tokenize") for n in ("ko", "en")}
    expected = nodes | {"tokenizer", "mix"}
    first = pretrain(cfg, return_state=True)
    assert first.is_completed(), first
    assert set(task_states(first, expected).values()) >= {"Completed"}
    assert first.result()["mix"]["sources"][0]["samples"] == 35
    second = pretrain(cfg, return_state=True)
    states = task_states(second, expected)
    assert all(states[name] == "Cached" for name in expected), states
