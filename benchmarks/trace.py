"""How fast `moai trace` answers on a big sample index: `--step N` and `--document FILE:ROW` on a
real moai cache whose train split has --samples samples (10M by default).

    python benchmarks/trace.py [--samples 10000000] [--seq-len 16] [--mode concat] [--repeats 3]

Building 10M samples from text would mean tokenizing ~160M tokens; instead the cache is made the
way moai makes it, then its token store is swapped for a bigger one:

1. a small corpus (--rows lines) is prepared by `moai.pipeline.prepare` (convert, filter, save,
   tokenizer, tokenize, pack), with a train section;
2. the tokenize output is built again under the same key, by `moai.store.Store.build`, as a token
   store of --samples x --seq-len random ids in documents of 2-100 tokens (the layout and files
   `moai.formats.tokens` reads: `.bin`, `.idx`, `.origin`, tokens.json, origins.json). Its first
   documents carry the origins of the corpus's train rows (so `--document` follows a real row to
   them), the rest repeat those origins;
3. the pack folder is removed and `prepare` runs again: the pack stage builds the real sample index
   of --samples windows over that store.

Then, each timed --repeats times (best and all printed): `moai trace CONFIG --step N --json` and
`moai trace CONFIG --document FILE:ROW` as cold processes (Python start, imports, the walk that finds
the published outputs, the answer), and in-process: opening the `Tracer`, `Tracer.step` (previews
included; a new `Tracer` each time) on a step of the first epoch and one of the third, and
`document_history`. The cold processes' CPU seconds are printed too: on a shared machine the wall
seconds include the waits for a core.
Disk: ~2 bytes a token + 16 bytes a sample + 16 bytes a document (10M x 16: ~0.6 GB), in --work
(default a temporary folder, removed after).
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` when a script of this folder runs.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import itertools
import json
import random
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()
MODEL = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 64,
}


def config_dict(work: Path, args) -> dict:
    return {
        "cache_dir": str(work / "cache"),
        "source": {"path": str(work / "corpus.jsonl"), "text_field": "text"},
        "tokenizer": {"train": {"vocab_size": 300}},
        "split": {"val_fraction": 0.01},
        "pack": {"seq_len": args.seq_len, "mode": args.mode},
        "train": {
            "model_config": MODEL,
            "micro_batch_size": args.micro_batch_size,
            "grad_accum_steps": args.grad_accum_steps,
            "max_steps": args.max_steps,
            "output_dir": str(work / "run"),
        },
    }


def write_corpus(path: Path, rows: int) -> None:
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 60)))}) + "\n")


def big_store(old_store: Path, num_tokens: int, seed: int = 0):
    """A builder for Store.build: the token store at `old_store` with its train split replaced by
    `num_tokens` random ids in documents of 2-100 tokens, in 16 parts."""
    from moai.formats.text import copy_origin_files
    from moai.formats.tokens import TokenStore

    old = TokenStore(old_store)
    meta = json.loads((old_store / "tokens.json").read_text())
    real_origins = old.split("train").origins
    assert real_origins is not None

    def build(out: Path) -> dict:
        rng = np.random.default_rng(seed)
        dtype = np.dtype(meta["dtype"])
        (out / "train").mkdir()
        shutil.copytree(old_store / "validation", out / "validation")
        lengths = rng.integers(2, 101, size=num_tokens // 2 + 2)
        ends = np.cumsum(lengths)
        docs = int(np.searchsorted(ends, num_tokens)) + 1
        lengths = lengths[:docs]
        lengths[-1] -= int(ends[docs - 1]) - num_tokens  # the last document ends at num_tokens exactly
        origins = np.resize(real_origins, docs).astype("<i8")
        parts, bounds = [], np.linspace(0, docs, 17).astype(np.int64)
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            stem = f"train/part-{i:05d}"
            part_lengths = lengths[lo:hi]
            n = int(part_lengths.sum())
            ids = rng.integers(3, meta["vocab_size"], size=n, dtype=np.int64).astype(dtype)
            ids[np.cumsum(part_lengths) - 1] = meta["eos_id"]  # every document ends with EOS
            ids.tofile(out / f"{stem}.bin")
            np.cumsum(part_lengths).astype("<i8").tofile(out / f"{stem}.idx")
            origins[lo:hi].tofile(out / f"{stem}.origin")
            parts.append({"bin": f"{stem}.bin", "idx": f"{stem}.idx", "num_tokens": n, "num_documents": int(hi - lo)})
        meta["splits"]["train"] = {"num_tokens": num_tokens, "num_documents": docs, "parts": parts}
        (out / "tokens.json").write_text(json.dumps(meta, indent=2))
        copy_origin_files(old_store, out)
        return {"documents": docs, "tokens": num_tokens, "synthetic": True}

    return build


def timed(fn, repeats: int) -> tuple[list[float], object]:
    seconds, out = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        seconds.append(round(time.perf_counter() - started, 3))
    return seconds, out


CLI_CPU: dict[str, list[float]] = {}  # CPU seconds (user + system) of each cold process, by command


def cli(config_file: Path, *args: str) -> str:
    """`moai trace CONFIG ARGS` in a cold process; its CPU seconds go to CLI_CPU (the machine is
    shared: wall seconds count the waits for a core, CPU seconds do not)."""
    moai = Path(sys.executable).parent / "moai"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [str(moai), "trace", str(config_file), *args], check=True, capture_output=True, text=True, cwd="/"
    ).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    CLI_CPU.setdefault(args[0], []).append(round(cpu, 3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--mode", choices=["concat", "best_fit"], default="concat")
    ap.add_argument("--rows", type=int, default=5000, help="lines of the small corpus")
    ap.add_argument("--micro-batch-size", type=int, default=64)
    ap.add_argument("--grad-accum-steps", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=60_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, help="keep the cache here (default: a temporary folder, removed)")
    args = ap.parse_args()

    import yaml

    from moai.config import parse_config
    from moai.pipeline import prepare
    from moai.store import FILES, MANIFEST, Store
    from moai.trace import Tracer, document_history

    work = args.work or Path(tempfile.mkdtemp(prefix="moai-trace-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        cfg = config_dict(work, args)
        config_file = work / "trace.yaml"
        config_file.write_text(yaml.safe_dump(cfg))
        config = parse_config(cfg)
        if not (work / "corpus.jsonl").exists():
            write_corpus(work / "corpus.jsonl", args.rows)
        started = time.perf_counter()
        prepared = prepare(config, progress=False)
        store = Store(config.cache_dir)
        tok = prepared["stages"]["tokenize"]
        if not tok.get("synthetic"):
            old_dir = Path(prepared["token_store"])
            manifest = json.loads((old_dir / MANIFEST).read_text())
            made_by_build = ("stage", "key", "moai_version", "report", "build_seconds", "built_at", FILES)
            keep = {k: v for k, v in manifest.items() if k not in made_by_build}  # inputs, settings, version
            saved = work / "small-store"
            shutil.rmtree(saved, ignore_errors=True)
            shutil.copytree(old_dir, saved)
            shutil.rmtree(old_dir)
            shutil.rmtree(prepared["sample_index"])
            store.build("tokenize", tok["key"], big_store(saved, args.samples * args.seq_len), keep)
            prepared = prepare(config, progress=False)  # the pack stage indexes the big store
        built = round(time.perf_counter() - started, 1)

        from moai.formats.tokens import PackedSamples, TokenStore

        num_samples = len(PackedSamples(prepared["sample_index"], "train"))
        per_step = args.micro_batch_size * args.grad_accum_steps
        steps = {"first": 1, "epoch 0": num_samples // per_step // 2, "epoch 2": 2 * num_samples // per_step + 7}
        opened, tracer = timed(lambda: Tracer(config, prepared), args.repeats)
        in_process = {  # a tracer of its own each time: the epoch's order is made again, as in a cold process
            name: timed(lambda s=step: Tracer(config, prepared).step(s), args.repeats)[0]
            for name, step in steps.items()
        }
        piece = tracer.step(steps["epoch 0"])[0].pieces[0]  # type: ignore[union-attr]
        document = piece.where
        history_s, history = timed(lambda: document_history(config, prepared, document), args.repeats)
        cli_step, out = timed(lambda: cli(config_file, "--step", str(steps["epoch 2"]), "--json"), args.repeats)
        traced = json.loads(out.splitlines()[-1])  # type: ignore[union-attr]
        cli_doc, doc_out = timed(lambda: cli(config_file, "--document", document), args.repeats)
        print(
            json.dumps(
                {
                    "samples": num_samples,
                    "seq_len": args.seq_len,
                    "mode": args.mode,
                    "documents": TokenStore(prepared["token_store"]).split("train").num_documents,
                    "samples_per_step": per_step,
                    "cache_built_s": built,
                    "tracer_open_s": opened,
                    "open_and_step_s": {f"{name} (step {steps[name]})": s for name, s in in_process.items()},
                    "document": document,
                    "document_history_s": history_s,
                    "read_by": history["read_by"]["num_samples"],  # type: ignore[index]
                    "load_average": [round(x, 1) for x in os.getloadavg()],
                    "cli_step_s": cli_step,
                    "cli_step_cpu_s": CLI_CPU["--step"],
                    "cli_step_samples": len(traced[0]["samples"]),
                    "cli_document_s": cli_doc,
                    "cli_document_cpu_s": CLI_CPU["--document"],
                    "cli_document_steps": [r["step"] for r in json.loads(doc_out)["read_by"]["reads"]],  # type: ignore[arg-type]
                }
            )
        )
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
