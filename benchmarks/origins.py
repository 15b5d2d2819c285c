"""What origins cost: cold `moai prepare` with origins against the code before them, same corpus,
same run; and that the token store's ids and the sample index are byte-identical to before.

    python benchmarks/origins.py --corpus bench/corpus.jsonl --tokenizer bench/tok [--baseline 03beb7d] [--repeats 2]

(`python benchmarks/make_corpus.py --out bench/corpus.jsonl --mb 50 --tokenizer-out bench/tok` makes
a corpus and a tokenizer; `--records N` many small documents, where a per-row cost shows most.)
The baseline is a git revision of this repository, exported with `git archive` into a temporary
folder and imported instead of the installed moai. Each cold prepare (convert, filter,
save, tokenize, pack into an empty cache) runs in its own process, baseline and current
interleaved, best of --repeats (the machine is shared: the best run is the least disturbed one).
Printed: seconds of each, the overhead in percent, the `.origin` bytes per document, and whether
every `.bin`, `.idx` and sample index `.npy` file is byte-identical to the baseline's.
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` when a script of this folder runs.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PREPARE = """
import json, os, sys
if os.environ.get("BASELINE_SRC"):  # the installed moai is editable: its finder would win over PYTHONPATH
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, os.environ["BASELINE_SRC"])
import moai
from moai.config import parse_config
from moai.pipeline import prepare
cfg = json.loads(sys.argv[1])
result = prepare(parse_config(cfg), progress=False)
print(json.dumps({"moai": moai.__file__, "token_store": result["token_store"], "sample_index": result["sample_index"],
                  "documents": result["num_documents"], "tokens": result["num_tokens"],
                  "stages": {k: v.get("seconds") for k, v in result["stages"].items()}}))
"""


def cold_prepare(src: Path | None, cfg: dict) -> tuple[float, dict]:
    """(wall seconds, result) of one cold prepare in a fresh process, moai imported from `src`."""
    env = dict(os.environ)
    if src is not None:
        env["BASELINE_SRC"] = str(src)
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", PREPARE, json.dumps(cfg)], env=env, check=True, capture_output=True, text=True, cwd="/"
    )
    return time.perf_counter() - started, json.loads(out.stdout.strip().splitlines()[-1])


def data_files(result: dict) -> dict[str, bytes]:
    """The ids, document boundaries and sample index files, by path relative to their folder."""
    out = {}
    for key, pattern in (("token_store", "*/*.bin"), ("token_store", "*/*.idx"), ("sample_index", "*.npy")):
        root = Path(result[key])
        for p in sorted(root.glob(pattern)):
            out[f"{key}/{p.relative_to(root)}"] = p.read_bytes()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--text-field", default="text")
    ap.add_argument("--baseline", default="03beb7d", help="git revision before origins (default: 03beb7d)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="moai-origins-") as tmp:
        base_src = Path(tmp) / "baseline"
        base_src.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(base_src)], input=archive.stdout, check=True)
        seconds: dict[str, list[float]] = {"baseline": [], "origins": []}
        results: dict[str, dict] = {}
        stages: dict[str, dict] = {}
        for r in range(args.repeats):
            pair = [("baseline", base_src), ("origins", None)]
            for name, src in pair if r % 2 == 0 else pair[::-1]:  # neither always runs second
                cfg = {
                    "cache_dir": str(Path(tmp) / f"cache-{name}-{r}"),
                    "source": {"path": str(Path(args.corpus).resolve()), "text_field": args.text_field},
                    "tokenizer": {"path": str(Path(args.tokenizer).resolve())},
                    "pack": {"seq_len": 2048},
                }
                s, results[name] = cold_prepare(src, cfg)
                if not seconds[name] or s < min(seconds[name]):
                    stages[name] = results[name]["stages"]
                seconds[name].append(s)
        assert results["baseline"]["moai"].startswith(str(base_src)), results["baseline"]["moai"]
        base, new = data_files(results["baseline"]), data_files(results["origins"])
        store = Path(results["origins"]["token_store"])
        origin_bytes = sum(p.stat().st_size for p in store.glob("*/*.origin"))
        best = {k: min(v) for k, v in seconds.items()}
        print(
            json.dumps(
                {
                    "corpus": args.corpus,
                    "documents": results["origins"]["documents"],
                    "tokens": results["origins"]["tokens"],
                    "seconds": {k: [round(x, 2) for x in v] for k, v in seconds.items()},
                    "overhead_percent": round(100 * (best["origins"] / best["baseline"] - 1), 2),
                    "stage_seconds_of_best": stages,
                    "origin_bytes_per_document": round(origin_bytes / results["origins"]["documents"], 2),
                    "files_compared": len(base),
                    "byte_identical": base == new,
                }
            )
        )


if __name__ == "__main__":
    main()
