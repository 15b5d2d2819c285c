"""Several real token stores (one per source, made by the pipeline from small jsonl corpora) and a
sample index of format 2 over them, written by hand as the mix stage writes it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from conftest import ROOT, TINY_MODEL, train_bpe, write_jsonl

KOREAN = ["모델", "데이터", "토큰", "학습", "한국어", "문서", "캐시", "빠르게", "그리고", "있다"]
CODE = ["def f(x):\n", "    return x * 2\n", "for i in range(3):\n", "    print(i)\n", "x = {'a': [1, 2]}\n"]
ENGLISH = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def source_texts(name: str, n: int, seed: int = 0) -> list[str]:
    """`n` documents of one kind: Korean paragraphs, code, or English-like words in a learnable cycle."""
    rng = random.Random(f"{name}-{seed}")
    if name == "ko":
        return [" ".join(rng.choice(KOREAN) for _ in range(rng.randint(10, 40))) for _ in range(n)]
    if name == "code":
        return ["".join(rng.choice(CODE) for _ in range(rng.randint(2, 8))) for _ in range(n)]
    return [" ".join(ENGLISH[(s + i) % len(ENGLISH)] for i in range(rng.randint(10, 40))) for s in range(n)]


def make_sources(root: Path, tokenizer: Path, docs: dict[str, int], val_fraction: float = 0.1) -> dict[str, Path]:
    """One token store per source under `root/cache` (the same cache dir): name -> token store folder."""
    from moai.config import parse_config
    from moai.pipeline import prepare

    stores = {}
    for name, n in docs.items():
        corpus = write_jsonl(root / "data" / name / "corpus.jsonl", [{"text": t} for t in source_texts(name, n)])
        cfg = parse_config(
            {
                "cache_dir": str(root / "cache"),
                "source": {"path": str(corpus)},
                "tokenizer": {"path": str(tokenizer)},
                "pack": {"enabled": False},
                "split": {"val_fraction": val_fraction},
            }
        )
        stores[name] = Path(prepare(cfg, progress=False)["token_store"])
    return stores


def windows(store: Path, split: str, seq_len: int) -> np.ndarray:
    """The full seq_len windows of a token split, as [start, length] rows."""
    from moai.formats.tokens import TokenStore

    n = TokenStore(store).split(split).num_tokens
    starts = np.arange(0, n - seq_len + 1, seq_len, dtype=np.int64)
    return np.stack([starts, np.full_like(starts, seq_len)], axis=1)


def write_mixed_index(
    cache: Path, stores: dict[str, Path], seq_len: int, counts: dict[str, int] | None = None, seed: int = 0
) -> Path:
    """A format-2 index under `cache/mix/<name>/`: train takes `counts[name]` windows of each
    source (all by default), interleaved by a seeded shuffle; validation keeps each source's windows,
    grouped by source."""
    folder = cache / "mix" / f"hand-{seed}-{seq_len}"
    folder.mkdir(parents=True)
    names = list(stores)
    splits = {}
    for split in ("train", "validation"):
        rows = []
        for k, name in enumerate(names):
            w = windows(stores[name], split, seq_len)
            if split == "train" and counts is not None:
                w = w[: counts[name]]
            rows.append(np.concatenate([np.full((len(w), 1), k, dtype=np.int64), w], axis=1))
        index = np.concatenate(rows) if rows else np.empty((0, 3), dtype=np.int64)
        if split == "train":
            index = index[np.random.default_rng(seed).permutation(len(index))]
        np.save(folder / f"{split}.npy", index)
        splits[split] = len(index)
    meta = {
        "format": "moai-sample-index/2",
        "seq_len": seq_len,
        "mode": "mix",
        "order": "as-stored",
        "sources": [{"name": n, "token_store": str(stores[n].relative_to(cache))} for n in names],
        "splits": splits,
    }
    (folder / "pack.json").write_text(json.dumps(meta, indent=2))
    return folder


SEQ = 32
NAMES = ["ko", "code", "en"]


def three_source_mix(root: Path, seeds: tuple[int, ...] = (0,)) -> tuple[Path, dict[str, Path], list[Path]]:
    """A tokenizer, three token stores (ko, code, en) and one mixed index of 150 train samples (90 ko,
    45 code, 15 en) per seed (the same windows in another order)."""
    tok = train_bpe(root / "tok", [t for n in NAMES for t in source_texts(n, 300)], vocab_size=400)
    stores = make_sources(root, tok, {"ko": 300, "code": 300, "en": 200})
    counts = {"ko": 90, "code": 45, "en": 15}
    return tok, stores, [write_mixed_index(root / "cache", stores, SEQ, counts=counts, seed=s) for s in seeds]


def launch_for(tok: Path, stores: dict[str, Path], index: Path, out: Path, **train):
    """The `accelerate launch` of a CPU run over `index` into `out` (train settings: a 24-step run,
    logging every step, overridden by `train`)."""
    from moai.config import parse_config
    from moai.launch import Launch, free_port, launch_command, resolve

    t = {
        "model_config": TINY_MODEL,
        "output_dir": str(out),
        "max_steps": 24,
        "micro_batch_size": 8,
        "lr": 3e-3,
        "warmup_steps": 2,
        "log_every": 1,
        "eval_every": 8,
        "save_every": 4,
        "eval_batches": 2,
        "tracker": "none",
        **train,
    }
    config = parse_config(
        {"source": {"path": "unused"}, "tokenizer": {"path": str(tok)}, "pack": {"seq_len": SEQ}, "train": t}
    )
    data = {"token_store": str(stores["ko"]), "sample_index": str(index), "tokenizer": str(tok)}
    resolved = resolve(config, data, loader_workers=0)
    assert config.train is not None
    launch = launch_command(
        config.train, str(resolved), num_gpus=0, port=free_port(), accelerate_config=str(out / "accelerate.yaml")
    )
    return Launch(launch.argv, {**launch.env, "PYTHONPATH": str(ROOT)}, launch.num_processes)
