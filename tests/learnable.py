"""A learnable corpus (each next word determined by the last one), its tokenizer, and the config of
a small CPU training run on it: what the real-launch training tests share."""

from __future__ import annotations

from pathlib import Path

from conftest import TINY_MODEL, train_bpe, write_jsonl

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def learnable_corpus(root: Path) -> tuple[Path, Path]:
    """The corpus (400 documents of 40 words) and a 300-token BPE trained on it, under `root`."""
    docs = [{"text": " ".join(WORDS[(s + i) % len(WORDS)] for i in range(40))} for s in range(400)]
    corpus = write_jsonl(root / "corpus.jsonl", docs)
    return corpus, train_bpe(root / "tok", [d["text"] for d in docs], vocab_size=300)


def config(root: Path, corpus, tok, out: Path, **train) -> dict:
    return {
        "cache_dir": str(root / "cache"),
        "source": {"path": str(corpus)},
        "tokenizer": {"path": str(tok)},
        "pack": {"seq_len": 32},
        "split": {"val_fraction": 0.05},
        "train": {
            "model_config": TINY_MODEL,
            "output_dir": str(out),
            "max_steps": 20,
            "micro_batch_size": 4,
            "lr": 3e-3,
            "warmup_steps": 2,
            "log_every": 1,
            "save_every": 5,
            "eval_batches": 2,
            "tracker": "none",
            **train,
        },
    }
