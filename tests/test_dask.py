"""The flow with `runner: {kind: dask}` maps the tokenize units on a real Dask LocalCluster
(2 worker processes on loopback) and publishes a token store byte-identical to a local run."""

from conftest import config_dict, make_texts, write_jsonl
from moai.config import parse_config
from moai.pipeline import prepare


def files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != "_manifest.json"}


def test_dask_local_cluster_gives_the_local_store(prefect_server, pretrain, tmp_path, tokenizer_dir):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in make_texts(12_000, seed=6) * 3])
    base = config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)})
    local = prepare(parse_config({**base, "cache_dir": str(tmp_path / "local")}), progress=False)

    cfg = parse_config({**base, "cache_dir": str(tmp_path / "dask"),
                        "runner": {"kind": "dask", "n_workers": 2, "num_shards": 4}})
    state = pretrain(cfg, return_state=True)
    assert state.is_completed(), state
    result = state.result()
    assert result["num_tokens"] == local["num_tokens"]
    parts = list((tmp_path / "dask" / "tokenize-parts").iterdir())
    assert len([p for p in parts if not p.name.startswith(".")]) > 4  # several parts, spread over 4 units
    a, b = files(tmp_path / "local" / "tokenize"), files(tmp_path / "dask" / "tokenize")
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a)
