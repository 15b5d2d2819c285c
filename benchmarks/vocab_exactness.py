"""Every document of a corpus through moai's tokenize stage, auto and each named engine, against transformers,
for production vocabularies of llama.cpp's tokenizer tests.

    bash scripts/setup.sh dev   # puts llama.cpp's GGUF vocabularies in .venv/share/llama-vocab
    python benchmarks/vocab_exactness.py --corpus bench/ko.jsonl --records 12000 \\
        --text-template $'{instruction}\\n{input}\\n{output}'

The documents: llama.cpp's tokenizer test strings (`.inp` files), `--records` records drawn at random
(seeded) from `--corpus`, and each vocabulary's own special tokens inside text. Each vocabulary
(`--vocab`, default all of `tests/real_tokenizers.py`'s `LLAMA_CPP`) is read by transformers'
GGUF converter and saved as a folder; the saved text is tokenized by `auto`, `fastokens`,
`gigatoken`, `tiktoken` and `tokenizers` in turn; each stored document is compared with
`tokenizer(text)["input_ids"]` + EOS. Prints, per vocabulary and engine: the engine used and
how many documents are equal, or the one-line refusal; for `auto`, every engine it tried and why.

`--prepare auto gigatoken ...` runs `moai prepare` (the CLI, in a fresh process, cold cache) with
each of those `tokenize.engine`s instead: the run's own path, with transformers in a process of
its own, the engine built ahead and the parts encoded beside the check. Its stored documents are
compared with transformers' ids of the text its save stage kept (`filter.min_chars: 0`, no
validation split).
"""

from __future__ import annotations

import os
import sys

# This folder's tokenize.py shadows the standard library's `tokenize` when a script here runs.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import logging
import random
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    import real_tokenizers as rt

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="JSONL records")
    parser.add_argument("--records", type=int, default=12000, help="records drawn from the corpus")
    parser.add_argument("--text-template", default="{text}", help="how a record becomes its text")
    parser.add_argument("--vocab", nargs="+", default=list(rt.LLAMA_CPP), help="of llama.cpp's vocabularies")
    parser.add_argument("--prepare", nargs="+", metavar="ENGINE", help="through `moai prepare` with these engines")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # transformers' notes on GGUF conversion

    from conftest import saved_text
    from moai.errors import TokenizerError
    from moai.stages import tokenize as tk
    from moai.stages.tokenizer import describe, load_tokenizer

    lines = Path(args.corpus).read_text(encoding="utf-8").splitlines()
    drawn = random.Random(0).sample(lines, min(args.records, len(lines)))
    texts = rt.llama_cpp_test_strings() + [args.text_template.format_map(json.loads(line)) for line in drawn]
    del lines
    for name in args.vocab:
        with tempfile.TemporaryDirectory(prefix="moai-vocab-") as tmp:
            folder = str(rt.llama_cpp(name, Path(tmp) / "tok"))
            hf = load_tokenizer(folder)
            docs = texts + [f"x {t} y{t}\n" for t in hf.all_special_tokens if t]
            if args.prepare:  # compared with transformers' ids of the text prepare's save stage kept
                for engine in args.prepare:
                    print(f"{name:15} {engine:10} {through_prepare(folder, hf, docs, engine, Path(tmp))}", flush=True)
                continue
            want = hf(docs)["input_ids"]
            info = describe(hf, folder, "")
            saved = saved_text(Path(tmp), docs, val_fraction=0.0)
            for engine in ("auto", "fastokens", "gigatoken", "tiktoken", "tokenizers"):
                out = Path(tmp) / engine
                out.mkdir()
                t0 = time.perf_counter()
                try:
                    report = tk.tokenize(
                        info, saved, out, num_proc=1, threads_per_proc=2, batch_size=512, engine=engine, progress=False
                    )
                except TokenizerError as err:
                    print(f"{name:15} {engine:10} refused: {err}", flush=True)
                    continue
                equal = count_equal(out, want, info.eos_id)
                seconds = time.perf_counter() - t0
                print(f"{name:15} {engine:10} {report['engine']:10} {equal:,} of {len(docs):,} equal ({seconds:.1f} s)")
                if engine == "auto":
                    for tried, why in report["engines_tried"].items():
                        print(f"{'':15} {'':10} {tried}: {why}", flush=True)


def count_equal(store: Path, want: list[list[int]], eos_id: int) -> int:
    """How many of the token store's train documents are transformers' ids (`want`) + EOS."""
    from moai.formats.tokens import TokenStore

    split = TokenStore(store).split("train")
    return sum(split.document(i).tolist() == [*ids, eos_id] for i, ids in enumerate(want))


def through_prepare(folder: str, hf, docs: list[str], engine: str, tmp: Path) -> str:
    """A cold `moai prepare` of `docs` with `tokenize.engine: engine`: its stored documents against transformers."""
    import shutil
    import subprocess

    from moai.formats.text import MappedTable

    source, cache, config = tmp / "docs.jsonl", tmp / "cache", tmp / "prepare.json"
    if not source.exists():
        source.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    shutil.rmtree(cache, ignore_errors=True)
    cfg = {
        "cache_dir": str(cache),
        "source": {"path": str(source)},
        "tokenizer": {"path": folder},
        "tokenize": {"engine": engine},
        "filter": {"min_chars": 0},
        "split": {"val_fraction": 0.0},
        "pack": {"seq_len": 2048},
    }
    config.write_text(json.dumps(cfg))
    run = subprocess.run([sys.executable, "-m", "moai.cli", "prepare", str(config)], capture_output=True, text=True)
    if run.returncode != 0:
        return f"refused (exit {run.returncode}): {run.stderr.strip().splitlines()[-1]}"
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    store = Path(summary["token_store"])
    report = json.loads((store / "_manifest.json").read_text())["report"]
    texts = MappedTable(cache / "save" / summary["stages"]["save"]["key"], "train").table.column(0).to_pylist()
    eos = json.loads((store / "tokens.json").read_text())["eos_id"]
    equal = count_equal(store, hf(texts)["input_ids"], eos)
    beside = "encoded beside the check" if report.get("check_beside_encoding") else "check first"
    return f"{report['engine']:10} {equal:,} of {len(texts):,} equal (moai prepare, {beside})"


if __name__ == "__main__":
    main()
