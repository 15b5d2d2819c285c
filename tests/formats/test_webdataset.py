"""WebDataset export read back by 2 ranks × 2 workers: every sample exactly once, same tokens."""

import json
import os
import subprocess

import pytest
import yaml

from conftest import PYTHON, ROOT, config_dict, make_texts, subprocess_env, write_jsonl
from moai.formats.tokens import PackedSamples
from moai.formats.webdataset import parse_size


@pytest.mark.slow
def test_two_ranks_two_workers_see_every_sample_once(tmp_path, tokenizer_dir):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in make_texts(3000, seed=8)])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)})))
    out = tmp_path / "wds"
    res = subprocess.run(
        [PYTHON, "-m", "moai.cli", "export-webdataset", str(cfg), "--out", str(out), "--shard-size", "40KB"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    manifest = json.loads((out / "manifest.json").read_text())
    shards = sorted(out.glob("shard-*.tar"))
    assert len(shards) == summary["num_shards"] == len(manifest["shards"]) >= 4
    assert sum(s["samples"] for s in manifest["shards"]) == manifest["samples"]
    again = subprocess.run(
        [PYTHON, "-m", "moai.cli", "export-webdataset", str(cfg), "--out", str(out)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=tmp_path,
    )
    assert again.returncode == 2 and "already holds shards" in again.stderr

    urls = str(out / f"shard-{{00000..{len(shards) - 1:05d}}}.tar")
    seen = {}
    for rank in (0, 1):
        env = {
            **subprocess_env(),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "assets"), subprocess_env()["PYTHONPATH"]]),
        }
        r = subprocess.run(
            [PYTHON, str(ROOT / "tests" / "assets" / "wds_rank.py"), urls, "64", manifest["dtype"]],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        mine = json.loads(r.stdout)
        assert mine and not set(mine) & set(seen)  # ranks are disjoint
        seen.update(mine)

    pack_dir = json.loads(
        subprocess.run(
            [PYTHON, "-m", "moai.cli", "prepare", str(cfg), "--no-progress"],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            cwd=tmp_path,
        )
        .stdout.strip()
        .splitlines()[-1]
    )["sample_index"]
    samples = PackedSamples(pack_dir, "train")
    assert sorted(seen) == [f"{i:09d}" for i in range(len(samples))]  # every sample exactly once
    for key, got in seen.items():
        want = samples[int(key)]
        assert got["ids"] == want["input_ids"].tolist() and got["pos"] == want["position_ids"].tolist()


def test_sizes_parse(tmp_path):
    assert parse_size("256MB") == 256_000_000 and parse_size("1GiB") == 2**30 and parse_size("100") == 100
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")
