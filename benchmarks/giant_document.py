"""Peak memory of `moai prepare` on one giant document, against the same text as normal documents.

    python benchmarks/giant_document.py --corpus bench/corpus.jsonl --tokenizer bench/tekken --mb 200 [--verify]

Builds two JSONL files from the corpus's documents, each about --mb megabytes of text: `normal`
(the documents themselves, repeated as needed) and `giant` (the same documents joined by "\\n"
into ONE document). Each runs `moai prepare` in a fresh process with a cold cache while this
process samples the RSS of it and its children every 20 ms. Before the fix, tokenizing one 50 MB
document peaked at 6.6 GB and a 200 MB one was killed for memory.

--verify also encodes the giant document whole with transformers (needs ~30x its size in memory:
use it with --mb 20 or so) and compares the stored ids with it, token by token.
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` (imported by transformers via
# linecache) when a script of this folder runs, because Python puts the script's folder first on sys.path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def corpus_texts(corpus: Path, mb: float) -> list[str]:
    texts, size = [], 0
    docs = [json.loads(line)["text"] for line in corpus.open(encoding="utf-8") if line.strip()]
    while size < mb * 1e6:
        for t in docs:
            texts.append(t)
            size += len(t.encode())
            if size >= mb * 1e6:
                break
    return texts


def write_inputs(texts: list[str], work: Path) -> dict[str, Path]:
    normal, giant = work / "normal.jsonl", work / "giant.jsonl"
    with normal.open("w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    with giant.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"text": "\n".join(texts)}, ensure_ascii=False) + "\n")
    return {"normal": normal, "giant": giant}


def run_prepare(data: Path, tokenizer: Path, work: Path) -> dict:
    """`moai prepare` in a fresh process; peak RSS of its process tree, seconds, its summary."""
    import psutil

    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=work))
    config = work / f"{data.stem}.yaml"
    config.write_text(
        json.dumps(
            {
                "cache_dir": str(cache),
                "source": {"path": str(data), "text_field": "text"},
                "tokenizer": {"path": str(tokenizer)},
                "split": {"val_fraction": 0.0},
                "filter": {"max_chars": None},
                "pack": {"seq_len": 2048},
            }
        )
    )
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moai.cli", "prepare", str(config), "--no-progress"], stdout=subprocess.PIPE, text=True
    )
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, sum(p.memory_info().rss for p in [ps, *ps.children(recursive=True)] if p.is_running()))
        time.sleep(0.02)
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"moai prepare {data.name} failed with exit code {proc.returncode}")
    summary = json.loads(out.strip().splitlines()[-1])
    report = json.loads((Path(summary["token_store"]) / "_manifest.json").read_text())["report"]
    return {
        "peak_rss_mb": round(peak / 2**20),
        "seconds": round(time.perf_counter() - started, 1),
        "documents": summary["num_documents"],
        "tokens": summary["num_tokens"],
        "engine": report["engine"],
        "large_documents": report.get("large_documents"),
        "forced_cuts": report.get("forced_cuts"),
        "token_store": summary["token_store"],
        "cache": str(cache),
    }


def verify(result: dict, text: str, tokenizer: Path) -> str:
    from transformers import AutoTokenizer

    from moai.formats.tokens import TokenStore

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    want = tok(text)["input_ids"] + [tok.eos_token_id]
    got = TokenStore(result["token_store"]).split("train").document(0).tolist()
    if got == want:
        return f"giant document: all {len(want):,} ids equal transformers'"
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return f"giant document DIFFERS from transformers at id {first} of {len(want):,} (moai has {len(got):,})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="JSONL with a text field (make_corpus.py)")
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--work", type=Path, default=Path("bench/giant"))
    parser.add_argument("--verify", action="store_true")
    args = parser.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.work))
    try:
        texts = corpus_texts(args.corpus, args.mb)
        inputs = write_inputs(texts, work)
        print(f"{args.mb:g} MB of text from {args.corpus}, tokenizer {args.tokenizer}", flush=True)
        results = {}
        for kind in ("normal", "giant"):
            results[kind] = run_prepare(inputs[kind], args.tokenizer, work)
            shutil.rmtree(results[kind]["cache"], ignore_errors=True) if kind == "normal" else None
        base = results["normal"]["peak_rss_mb"]
        print("| input | documents | tokens | engine | large docs | forced cuts | seconds | peak RSS MB | × normal |")
        print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
        for kind, r in results.items():
            print(
                f"| {kind} | {r['documents']:,} | {r['tokens']:,} | {r['engine']} | {r['large_documents']} | "
                f"{r['forced_cuts']} | {r['seconds']} | {r['peak_rss_mb']:,} | {r['peak_rss_mb'] / base:.2f} |"
            )
        if args.verify:
            print(verify(results["giant"], "\n".join(texts), args.tokenizer))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
