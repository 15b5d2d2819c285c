"""The flow with `runner: {kind: dask}` maps the dedup signature units and the tokenize units on a
real Dask LocalCluster (2 worker processes on loopback) and publishes signatures and a token store
byte-identical to a local run."""

import contextlib

import pytest

from conftest import config_dict, make_texts, store_files as files, write_jsonl
from moai.config import parse_config
from moai.pipeline import prepare

# A Prefect test server and a Dask LocalCluster with worker processes.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("where", ["local-cluster", "scheduler-address"])
def test_dask_gives_the_local_store(prefect_server, pretrain, tmp_path, tokenizer_dir, where):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in make_texts(36_000, seed=6)])
    base = {**config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}), "dedup": {"near": {}}}
    local = prepare(parse_config({**base, "cache_dir": str(tmp_path / "local")}), progress=False)

    with contextlib.ExitStack() as stack:
        runner = {"kind": "dask", "n_workers": 2, "num_shards": 4}
        if where == "scheduler-address":  # an existing cluster, reached by its address
            from distributed import LocalCluster

            cluster = stack.enter_context(
                LocalCluster(
                    n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
                )
            )
            runner = {"kind": "dask", "address": cluster.scheduler_address, "num_shards": 4}
        cfg = parse_config({**base, "cache_dir": str(tmp_path / "dask"), "runner": runner})
        state = pretrain(cfg, return_state=True)
        assert state.is_completed(), state
    result = state.result()
    assert result["num_tokens"] == local["num_tokens"]
    parts = list((tmp_path / "dask" / "tokenize-parts").iterdir())
    assert len([p for p in parts if not p.name.startswith(".")]) > 4  # several parts, spread over 4 units
    for stage in ("signatures", "dedup", "tokenize"):
        a, b = files(tmp_path / "local" / stage), files(tmp_path / "dask" / stage)
        assert a.keys() == b.keys(), stage
        # a text folder's state.json holds a fingerprint `datasets` makes from its work file's path
        assert all(a[k] == b[k] for k in a if k.name != "state.json"), stage
    dropped = local["stages"]["dedup"]["dropped"]
    assert result["stages"]["dedup"]["dropped"] == dropped and dropped["exact_duplicate"] > 0
