"""Shared fixtures: small real corpora and tokenizers made in the test session, never downloaded."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

WORDS = ["data", "model", "token", "pack", "train", "fast", "cache", "stage", "loss", "step"]
KOREAN = ["모델", "데이터", "토큰", "학습", "한국어", "문서", "캐시", "빠르게"]
CODE = ["def f(x):\n    return x * 2\n", "for i in range(3):\n    print(i)\n", "x = {'a': [1, 2]}\n"]
EMOJI = ["🙂", "🚀", "👩‍💻", "🇰🇷"]


def make_texts(n: int, seed: int = 0) -> list[str]:
    """A mix of English-like words, Korean, code and emoji; a few are whitespace-only."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = rng.random()
        if i % 97 == 5:
            out.append("   \n ")
        elif r < 0.4:
            out.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60))))
        elif r < 0.7:
            out.append(" ".join(rng.choice(KOREAN) for _ in range(rng.randint(3, 40))))
        elif r < 0.9:
            out.append("".join(rng.choice(CODE) for _ in range(rng.randint(1, 5))))
        else:
            out.append(" ".join(rng.choice(WORDS + EMOJI) for _ in range(rng.randint(1, 20))))
    return out


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module, loaded once."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load_clean_corpus():
    """benchmarks/clean_corpus.py as a module (the held-out-style corpus generator, with its truth)."""
    return load_benchmark("clean_corpus")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def train_bpe(folder: Path, texts: list[str], vocab_size: int = 600, bos: bool = False) -> Path:
    """Train a byte-level BPE in-process and save it as a Hugging Face fast tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<eos>", "<pad>"] + (["<bos>"] if bos else [])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if bos:
        bos_id = tok.token_to_id("<bos>")
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>" if bos else None
    )
    fast.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    return train_bpe(tmp_path_factory.mktemp("tok"), make_texts(2000, seed=1))


@pytest.fixture(scope="session")
def bos_tokenizer_dir(tmp_path_factory) -> Path:
    return train_bpe(tmp_path_factory.mktemp("tokbos"), make_texts(2000, seed=2), bos=True)


@pytest.fixture
def corpus(tmp_path) -> Path:
    rows = [{"id": i, "text": t} for i, t in enumerate(make_texts(1500, seed=3))]
    return write_jsonl(tmp_path / "data" / "corpus.jsonl", rows)


def config_dict(tmp_path: Path, source_path: Path | str, tokenizer: dict, **extra) -> dict:
    cfg = {
        "cache_dir": str(tmp_path / "cache"),
        "source": {"path": str(source_path), "text_field": "text"},
        "tokenizer": tokenizer,
        "pack": {"seq_len": 64},
        "split": {"val_fraction": 0.05},
    }
    for section, values in extra.items():
        if isinstance(values, dict):
            cfg.setdefault(section, {}).update(values)
        else:
            cfg[section] = values
    return cfg


def saved_text(tmp_path: Path, texts: list[str], val_fraction=0.1) -> Path:
    """`texts` as the save stage writes them (train and validation splits), under tmp_path/saved."""
    from moai.config import parse_config
    from moai.formats.text import write_text_dataset
    from moai.stages.save import save

    text_dir = tmp_path / "text"
    text_dir.mkdir()
    write_text_dataset([texts], text_dir, "1MB")
    out = tmp_path / "saved"
    out.mkdir()
    cfg = parse_config({"source": {"path": "x"}, "tokenizer": {"path": "t"}, "split": {"val_fraction": val_fraction}})
    save(cfg.split, text_dir, out, max_shard_size="64KB")
    return out


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def moai_cli(*args: str, cwd, env: dict[str, str] | None = None, timeout: float = 300):
    """`python -m moai.cli ARGS` in `cwd` (output captured as text), with the repository importable."""
    return subprocess.run(
        [PYTHON, "-m", "moai.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**subprocess_env(), **(env or {})},
        timeout=timeout,
    )


def moai_started(*args: str, cwd) -> subprocess.Popen:
    """`python -m moai.cli ARGS` started in `cwd` in a session (process group) of its own, output
    piped as text: a test can signal it and its workers, as a terminal's Ctrl-C or a kill would."""
    return subprocess.Popen(
        [PYTHON, "-m", "moai.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=cwd,
        start_new_session=True,
    )


# The tiny Llama the training tests launch (`train.model`).
TINY_MODEL = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def run_offline(code: str, tmp_path: Path):
    """Run Python code in a fresh process with the Hugging Face offline switches set before import."""
    import subprocess

    env = {**subprocess_env(), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    return subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A Prefect test server for the session (telemetry off, heartbeats off, results in a temp dir)."""
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_LOCAL_STORAGE_PATH,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    storage = tmp_path_factory.mktemp("prefect-storage")
    with (
        temporary_settings(
            {
                PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
                PREFECT_SERVER_ANALYTICS_ENABLED: False,
                PREFECT_LOCAL_STORAGE_PATH: storage,
            }
        ),
        prefect_test_harness(server_startup_timeout=90),
    ):
        yield


@pytest.fixture(scope="session")
def pretrain():
    """The `pretrain` flow object from flows/pretrain.py."""
    sys.path.insert(0, str(ROOT))
    try:
        from flows.pretrain import pretrain as flow
    finally:
        sys.path.remove(str(ROOT))
    return flow


# The data stages of the flow, as Prefect task names.
DATA_STAGES = {"convert", "filter", "save", "tokenizer", "tokenize", "pack"}


def task_states(flow_state, expected: set[str] = DATA_STAGES, wait_s: float = 20) -> dict[str, str]:
    """Final state name of each task of a flow run, read back from the server (states arrive asynchronously)."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run_id = flow_state.state_details.flow_run_id
    deadline = time.monotonic() + wait_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            states = {r.name.rsplit("-", 1)[0]: r.state for r in runs}
            done = expected <= set(states) and all(states[s] is not None and states[s].is_final() for s in expected)
            if done or time.monotonic() > deadline:
                return {name: (st.name if st else None) for name, st in states.items()}
            time.sleep(0.2)


def store_files(root: Path) -> dict[Path, bytes]:
    """Every file of the published entries under a store folder with its bytes; manifests (timings)
    with their digests, and the store's hidden bookkeeping (lock files, the `.uses.jsonl` use log)
    left out."""
    return {
        p.relative_to(root): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and p.name not in ("_manifest.json", "_manifest.xxh3")
        and not p.relative_to(root).parts[0].startswith(".")
    }


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """No Hugging Face hub: an endpoint that refuses connections at once, empty caches, and no
    answer remembered from an earlier test (`moai.hub` keeps them for the process)."""
    from huggingface_hub import constants

    from moai import hub

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setattr(hub, "_DOWN", set())
    hub._head.cache_clear()
    return tmp_path / "hf-hub"


def lock_down(path):
    """Make `path` unwritable for the code under test; return the undo, which takes the path (it may
    have moved). Root ignores file modes, so as root the file or folder is made immutable
    (`chattr +i`): the kernel then refuses writes to root too."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o444 if path.is_file() else 0o555)
        return lambda moved: moved.chmod(mode)
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip(f"root, and chattr +i is not supported on {path}'s filesystem: cannot make it read-only")
    return lambda moved: subprocess.run(["chattr", "-i", str(moved)], check=True)


@contextlib.contextmanager
def read_only(path):
    undo = lock_down(path)
    try:
        yield
    finally:
        undo(path)


def units_baseline(tmp_path: Path, tokenizer_dir: Path) -> tuple[dict, dict]:
    """The config the Dask and Ray flow tests map units with (dedup on, so signature units too), and
    the summary of a local `prepare` of it into tmp_path/local."""
    from moai.config import parse_config
    from moai.pipeline import prepare

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in make_texts(36_000, seed=6)])
    base = {**config_dict(tmp_path, corpus, {"path": str(tokenizer_dir)}), "dedup": {"near": {}}}
    return base, prepare(parse_config({**base, "cache_dir": str(tmp_path / "local")}), progress=False)


def assert_units_match_local(tmp_path: Path, cache: str, local: dict, result: dict) -> None:
    """A flow run whose units were mapped (cache tmp_path/<cache>) gives what the local run gave:
    several tokenize parts, and the signatures, dedup output and token store byte for byte."""
    assert result["num_tokens"] == local["num_tokens"]
    parts = list((tmp_path / cache / "tokenize-parts").iterdir())
    assert len([p for p in parts if not p.name.startswith(".")]) > 4  # several parts, spread over 4 units
    for stage in ("signatures", "dedup", "tokenize"):
        a, b = store_files(tmp_path / "local" / stage), store_files(tmp_path / cache / stage)
        assert a.keys() == b.keys(), stage
        # a text folder's state.json holds a fingerprint `datasets` makes from its work file's path
        assert all(a[k] == b[k] for k in a if k.name != "state.json"), stage
    dropped = local["stages"]["dedup"]["dropped"]
    assert result["stages"]["dedup"]["dropped"] == dropped and dropped["exact_duplicate"] > 0


def serving(server):
    """Yields a started test server (tests/s3_server.py, tests/gcs_server.py), then stops it by pid and
    removes its folder."""
    from s3_server import remove

    try:
        yield server
    finally:
        remove(server)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server (SeaweedFS on loopback, tests/s3_server.py) for the session's S3 tests; stopped by pid."""
    from s3_server import started_server

    yield from serving(started_server())


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A new bucket on the session's S3 server, with its credentials in the environment (as a user's)."""
    from s3_server import new_bucket

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return new_bucket(s3_server)


@pytest.fixture(scope="session")
def gcs_server():
    """A real GCS server (fake-gcs-server on loopback, tests/gcs_server.py) for the session; stopped by pid."""
    from gcs_server import started_server

    yield from serving(started_server())


@dataclass
class Bucket:
    """A new bucket on one of the session's object-store servers, for the tests that run on both
    (`s3://` on SeaweedFS, `gs://` on fake-gcs-server)."""

    scheme: str
    name: str
    server: Any  # S3Server or GCSServer: .fs(), .options (moai's storage_options), .env()

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.name}/{path}"

    @property
    def options(self) -> dict:
        return self.server.options


@pytest.fixture(params=["s3", "gs"])
def bucket(request) -> Bucket:
    """A new bucket on the S3 server (its credentials in the environment), then on the GCS server."""
    if request.param == "s3":
        return Bucket("s3", request.getfixturevalue("s3_bucket"), request.getfixturevalue("s3_server"))
    from s3_server import new_bucket

    server = request.getfixturevalue("gcs_server")
    return Bucket("gs", new_bucket(server), server)


@pytest.fixture(scope="session")
def hf_server():
    """A real Hugging Face Hub API (olah, offline, on loopback, tests/hf_server.py) serving local git
    repositories as datasets; stopped by pid."""
    from hf_server import started_server

    yield from serving(started_server())


def serve_needing_torch(
    conn, folder: str, without_torch: bool = False, compare_file: bool = False, affixes: bool = False
) -> None:
    """A reference process (`moai.stages.tokenize.reference._serve`) for a folder that loads only
    with torch: without it, it answers "retry" as the real one does when transformers fails."""
    from moai.stages.tokenize import reference

    if without_torch:
        conn.send(("retry", "ImportError: this tokenizer needs torch (a test)"))
        return
    reference._serve(conn, folder, False, compare_file, affixes)


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB tmpfs (root only; skipped where it cannot be mounted)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
        ).returncode
    ):
        pytest.skip("needs root and tmpfs mounts to fill a real disk")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)
