"""The flow with `runner: {kind: dask}` maps the dedup signature units and the tokenize units on a
real Dask LocalCluster (2 worker processes on loopback) and publishes signatures and a token store
byte-identical to a local run."""

import contextlib

import pytest

from conftest import assert_units_match_local, units_baseline
from moai.config import parse_config

# A Prefect test server and a Dask LocalCluster with worker processes.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("where", ["local-cluster", "scheduler-address"])
def test_dask_gives_the_local_store(prefect_server, pretrain, tmp_path, tokenizer_dir, where):
    base, local = units_baseline(tmp_path, tokenizer_dir)

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
    assert_units_match_local(tmp_path, "dask", local, state.result())
