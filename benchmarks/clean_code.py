"""Code kept, low-quality prose and other languages dropped: the quality and language stages on a
corpus of Korean, English and code (benchmarks/clean_corpus.py --mix code), against its truth.

    python benchmarks/clean_code.py OUT_DIR --docs 20000 [--seed 0]

The corpus: English and Korean prose, code files, instruction + Python solution records (English
or Korean task; plain, fenced, Alpaca, Q/A layouts; one-line to 16-line solutions), evaluation
items planted in prose and in code (as the instruction, the docstring or comments), low-quality
pages and other languages. Each setup runs the pipeline (`moai.pipeline.walk`) up to its last
cleaning stage, in OUT_DIR/cache (convert and filter are shared); the kept rows are matched to
the truth by their text. Printed: per setup, the share of code documents kept (code files,
instruction records, planted code; decontaminate's drops not counted against it), of English and
Korean prose kept, of low-quality pages and other-language documents dropped, the stages'
`code_exempt` counts, and (setups with decontaminate) the planted items caught of those that
reached it. A JSON line with the same figures ends the output.
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` when a script of this folder runs
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import importlib.util
import json
from collections import Counter
from pathlib import Path

GOPHER_C4_FINEWEB = ["gopher", "c4", "fineweb"]
SETUPS = {
    "quality gopher": {"quality": {"rules": "gopher"}},
    "quality c4": {"quality": {"rules": "c4"}},
    "quality fineweb": {"quality": {"rules": "fineweb"}},
    "quality gopher+c4+fineweb": {"quality": {"rules": GOPHER_C4_FINEWEB}},
    "language ko,en": {"language": {"keep": ["ko", "en"], "min_score": 0.65}},
    "all": {
        "quality": {"rules": GOPHER_C4_FINEWEB},
        "language": {"keep": ["ko", "en"], "min_score": 0.65},
        "decontaminate": {"ngram": 13},
    },
}


def _corpus_module():
    path = Path(__file__).with_name("clean_corpus.py")
    spec = importlib.util.spec_from_file_location("clean_corpus", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def measure(corpus, code_kinds: tuple[str, ...], cache: Path, setup: dict) -> dict:
    """One setup's figures (see the module docstring)."""
    from moai import pipeline
    from moai.config import parse_config
    from moai.formats.text import MappedTable

    cleaning = {k: v for k, v in setup.items() if k != "decontaminate"}
    if "decontaminate" in setup:
        cleaning["decontaminate"] = {"path": str(corpus.evals), "text_field": "question", **setup["decontaminate"]}
    cfg = parse_config(
        {
            "cache_dir": str(cache),
            "source": {"path": str(corpus.data)},
            "tokenizer": {"train": {"vocab_size": 1000}},
            **cleaning,
        }
    )
    last = [s for s in ("quality", "language", "decontaminate") if s in setup][-1]
    res = pipeline.walk(cfg, until=last)
    docs, texts = corpus.docs, corpus.texts
    kind_of = {t: d["kind"] for t, d in zip(texts, docs, strict=True)}
    total = Counter(d["kind"] for d in docs)

    def kept_by_kind(stage: str) -> Counter[str]:
        return Counter(kind_of[t] for t in MappedTable(res[stage].path).table.column(0).to_pylist())

    before = "language" if last == "decontaminate" else last  # what reached decontaminate, if it runs
    kept = kept_by_kind(before)
    code = sum(total[k] for k in code_kinds)
    out = {
        "code_kept": round(sum(kept[k] for k in code_kinds) / code, 4),
        "code_documents": code,
        "instruct_kept": round(kept["instruct"] / total["instruct"], 4),
        "prose_kept": round((kept["en"] + kept["ko"]) / (total["en"] + total["ko"]), 4),
        "low_dropped": round(1 - kept["low"] / total["low"], 4),
        "other_dropped": round(1 - kept["other"] / total["other"], 4),
        "code_exempt": {
            s: res[s].report.get("counts", {}).get("code_exempt") for s in ("quality", "language") if s in res
        },
    }
    if last == "decontaminate":
        planted = ("planted", "planted_code")
        after = kept_by_kind("decontaminate")
        reached = sum(kept[k] for k in planted)
        out["planted_caught"] = f"{reached - sum(after[k] for k in planted)}/{reached}"
        out["planted_reached"] = f"{reached}/{sum(total[k] for k in planted)}"
        out["decontaminate_dropped_other"] = sum(kept[k] - after[k] for k in kept if k not in planted)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    clean_corpus = _corpus_module()
    corpus = clean_corpus.generate(args.out_dir / "corpus", args.docs, seed=args.seed, mix="code")
    kinds = Counter(d["kind"] for d in corpus.docs)
    print(f"corpus: {len(corpus.docs):,} documents, {dict(kinds)}")
    results = {}
    print("| setup | code kept | instruction records kept | en+ko prose kept | low-quality dropped "
          "| other languages dropped | code_exempt | planted caught / reached |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, setup in SETUPS.items():
        r = measure(corpus, clean_corpus.CODE_KINDS, args.out_dir / "cache", setup)
        results[name] = r
        exempt = ", ".join(f"{s} {n:,}" for s, n in r["code_exempt"].items() if n is not None) or "-"
        print(
            f"| {name} | {r['code_kept']:.2%} of {r['code_documents']:,} | {r['instruct_kept']:.2%} "
            f"| {r['prose_kept']:.2%} | {r['low_dropped']:.2%} | {r['other_dropped']:.2%} | {exempt} "
            f"| {r.get('planted_caught', '-')} |"
        )
    print(json.dumps({"documents": len(corpus.docs), "seed": args.seed, "kinds": dict(kinds), "setups": results}))


if __name__ == "__main__":
    main()
