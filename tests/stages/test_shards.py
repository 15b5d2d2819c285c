"""tokenize-shard units as separate processes, in random order, some twice and at the same time;
then merge: the token store is byte-identical to a local run's."""

import json
import random
import subprocess

import pytest
import yaml

from conftest import (
    PYTHON,
    config_dict,
    make_texts,
    moai_cli as moai,
    store_files as files,
    subprocess_env,
    write_jsonl,
)
from moai.config import parse_config
from moai.pipeline import prepare

# Every test here runs the CLI in subprocesses (tokenize-shard, merge).
pytestmark = pytest.mark.slow


def test_shards_in_any_order_merge_to_the_local_store(tmp_path, tokenizer_dir):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in make_texts(12_000, seed=5) * 3])
    data = config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)})
    local = prepare(parse_config({**data, "cache_dir": str(tmp_path / "local")}), progress=False)

    data["cache_dir"] = str(tmp_path / "sharded")
    cfg = tmp_path / "sharded.yaml"
    cfg.write_text(yaml.safe_dump(data))
    n = 3
    early = moai("merge", str(cfg), "--num-shards", str(n), cwd=tmp_path)
    assert (
        early.returncode == 2
        and "tokenize parts are not done" in early.stderr
        and "--shard-index [0, 1, 2]" in early.stderr
    )

    order = [2, 0, 2, 1]  # shard 2 twice: the second run skips its finished parts
    random.Random(0).shuffle(order)
    procs = [
        subprocess.Popen(
            [PYTHON, "-m", "moai.cli", "tokenize-shard", str(cfg), "--shard-index", str(i), "--num-shards", str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=subprocess_env(),
        )
        for i in order[:2]
    ]  # two at the same time
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    for i in order[2:]:
        out = moai("tokenize-shard", str(cfg), "--shard-index", str(i), "--num-shards", str(n), cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
    again = json.loads(
        moai("tokenize-shard", str(cfg), "--shard-index", "2", "--num-shards", str(n), cwd=tmp_path)
        .stdout.strip()
        .splitlines()[-1]
    )
    assert again["built"] == 0 and again["skipped"] == again["parts"] > 0

    merged = moai("merge", str(cfg), cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr[-2000:]
    result = json.loads(merged.stdout.strip().splitlines()[-1])
    assert result["num_tokens"] == local["num_tokens"] and result["sample_index"]
    a, b = files(tmp_path / "local" / "tokenize"), files(tmp_path / "sharded" / "tokenize")
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a)
    assert len([k for k in a if k.suffix == ".bin"]) > n  # really several parts per shard
    # the documents' origins too: an `.origin` beside every part, and the source's files named once
    assert len([k for k in a if k.suffix == ".origin"]) == len([k for k in a if k.suffix == ".bin"])
    assert len([k for k in a if k.name == "origins.json"]) == 1


def test_shard_index_is_checked(tmp_path, corpus, tokenizer_dir):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)})))
    out = moai("tokenize-shard", str(cfg), "--shard-index", "3", "--num-shards", "3", cwd=tmp_path)
    assert out.returncode == 2 and "--shard-index 3 is out of range for --num-shards 3: use 0 to 2" in out.stderr
    assert not (tmp_path / "cache").exists()  # checked before any stage ran
