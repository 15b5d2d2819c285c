"""Near-duplicate removal: moai's signatures + dedup stages against datatrove's MinHash pipeline.

    python benchmarks/dedup.py [--docs 25000] [--corpus DIR] [--workers 2] [--repeats 3] [--work DIR]

The corpus is benchmarks/clean_corpus.py's, English-heavy (`--mix english`), so that datatrove's
English word tokenizer is on home ground; it is generated (not timed) unless --corpus names one.
Both sides use word 5-grams and 14 bands × 8 rows (112 hashes) at threshold 0.8, on the same
number of processes (--workers). Each contender runs in a fresh subprocess, cold (a new scratch
folder and cache each time), in interleaved rounds; the best of --repeats runs is kept:

- datatrove 0.10: `MinhashDedupSignature` (reading the JSONL split into --dt-files files, one task
  each), `MinhashDedupBuckets` (14 tasks, one per band), `MinhashDedupCluster`, each a
  `LocalPipelineExecutor` with --workers workers; timed: the three (the brief's figure), and
  `MinhashDedupFilter` writing the kept documents, printed apart. Its word tokenizer for English is
  spaCy's, which is not installed here (and NLTK is not either); the contender uses
  `SplitTokenizer`, `str.split` on datatrove's own `simplify_text` output (lower case, numbers
  to 0, punctuation to spaces, whitespace collapsed), which gives the words spaCy gives on that
  punctuation-free text and is faster than spaCy, so datatrove's time here is a lower bound.
- moai: the signatures and dedup stages on the converted text (convert and filter run first,
  not timed, printed apart), `dedup.exact: false` (MinHash only, as datatrove), bands 14, rows
  8, `resources.num_proc` = --workers, keep_dropped (to read what was removed); once with
  `verify: false` (like for like: every LSH candidate joins) and once with `verify: true` (the
  default: candidates checked by exact Jaccard); and once more with `verify: false` and
  `seed: 2`: how much two runs of the same LSH with other hash functions disagree.

Printed: each contender's seconds and the ratio datatrove / moai, and its CPU seconds (its
process and finished workers: less sensitive than wall time to other work on a shared machine);
the removed sets' sizes and agreement |A∩B| / |A∪B|, as each tool keeps documents (moai the
first of a cluster, datatrove the root its union-find picks) and as if both kept the first of each
cluster (datatrove's clusters from its .dups pairs, read after timing); and against the ground
truth: recall over the copies (exact copies, and near copies at true Jaccard ≥ 0.8: found when
the copy and its original end in one cluster) and precision (a removed document is right when its
cluster's first document is its planted original, or their word 5-gram Jaccard is ≥ 0.8).
"""

from __future__ import annotations

import os
import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` when a script of this folder
# runs, because Python puts the script's folder first on sys.path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import re
import resource
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NGRAM, BANDS, ROWS, THRESHOLD = 5, 14, 8, 0.8


def _generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("clean_corpus", ROOT / "benchmarks" / "clean_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (pool workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# --- datatrove --------------------------------------------------------------------------------


def _split_tokenizer():
    from datatrove.utils.word_tokenizers import WordTokenizer

    class SplitTokenizer(WordTokenizer):
        """Whitespace words of datatrove's simplified text (no spaCy/NLTK offline; see the docstring)."""

        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    return SplitTokenizer("en")


def _encode_for_xxhash() -> None:
    """datatrove 0.10.1 passes str to xxhash, which xxhash 4 refuses ('Strings must be encoded
    before hashing'): its default hash config fails as installed. Hash the UTF-8 bytes, as
    xxhash 3 did for a str."""
    import xxhash
    from datatrove.utils.hashes import xxhash as dt_xxhash

    dt_xxhash.xxhash64 = lambda data: xxhash.xxh64_intdigest(data.encode() if isinstance(data, str) else data)
    dt_xxhash.xxhash32 = lambda data: xxhash.xxh32_intdigest(data.encode() if isinstance(data, str) else data)


def run_datatrove(corpus: Path, work: Path, workers: int, files: int, **_) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    _encode_for_xxhash()
    inputs = work / "input"
    cfg = MinhashConfig(
        hash_config=HashConfig(precision=64, hash_fc="xxhash"), n_grams=NGRAM, num_buckets=BANDS, hashes_per_bucket=ROWS
    )
    tok = _split_tokenizer()
    logs = work / "logs"

    def reader():
        return JsonlReader(str(inputs), glob_pattern="*.jsonl", text_key="text")

    steps = [
        ("signature", [reader(), MinhashDedupSignature(str(work / "sigs"), config=cfg, language=tok)], files),
        ("buckets", [MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=cfg)], BANDS),
        ("cluster", [MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=cfg)], 1),
        (
            "filter",
            [reader(), MinhashDedupFilter(str(work / "remove")), JsonlWriter(str(work / "out"), compression=None)],
            files,
        ),
    ]
    seconds, cpu = {}, {}
    for name, pipeline, tasks in steps:
        ex = LocalPipelineExecutor(
            pipeline, tasks=tasks, workers=min(workers, tasks), logging_dir=str(logs / name), start_method="fork"
        )
        started, cpu_started = time.perf_counter(), cpu_seconds()
        ex.run()
        seconds[name] = time.perf_counter() - started
        cpu[name] = cpu_seconds() - cpu_started
    return {
        "seconds": seconds["signature"] + seconds["buckets"] + seconds["cluster"],
        "cpu_seconds": cpu["signature"] + cpu["buckets"] + cpu["cluster"],
        "steps": {k: round(v, 2) for k, v in seconds.items()},
    }


def datatrove_sets(work: Path, offsets: list[int]) -> tuple[set[int], list[tuple[int, int]]]:
    """(removed line numbers, duplicate pairs as line numbers) from datatrove's files."""
    removed = set()
    for f in sorted((work / "remove").glob("*.remove")):
        rank = int(f.name.split(".")[0])
        data = f.read_bytes()
        removed.update(offsets[rank] + d for (d,) in struct.iter_unpack("<I", data))
    pairs = []
    for f in sorted((work / "buckets").glob("*.dups")):
        for f1, d1, f2, d2 in struct.iter_unpack("<4I", f.read_bytes()):
            pairs.append((offsets[f1] + d1, offsets[f2] + d2))
    return removed, pairs


# --- moai -------------------------------------------------------------------------------------


def _moai_config(corpus: Path, work: Path, workers: int, verify: bool, seed: int = 1):
    from moai.config import parse_config

    return parse_config(
        {
            "cache_dir": str(work / "cache"),
            "source": {"path": str(corpus / "data.jsonl")},
            "dedup": {
                "exact": False,
                "near": {
                    "threshold": THRESHOLD,
                    "ngram": NGRAM,
                    "num_perm": BANDS * ROWS,
                    "bands": BANDS,
                    "rows": ROWS,
                    "verify": verify,
                    "seed": seed,
                },
            },
            "keep_dropped": True,
            "resources": {"num_proc": workers},
            "tokenizer": {"path": str(ROOT / "examples" / "tokenizer")},
            "pack": {"seq_len": 64},
        }
    )


def run_moai(corpus: Path, work: Path, workers: int, verify: bool, seed: int = 1, **_) -> dict:
    from moai import pipeline
    from moai.config import read_env
    from moai.hardware import detect, plan

    cfg = _moai_config(corpus, work, workers, verify, seed)
    hw_plan = plan(detect(work, with_gpus=False), cfg, read_env())
    started = time.perf_counter()
    before = pipeline.walk(cfg, until="filter")
    convert_seconds = time.perf_counter() - started
    started, cpu_started = time.perf_counter(), cpu_seconds()
    sig = pipeline.run_stage(cfg, "signatures", {"filter": before["filter"]}, plan=hw_plan, progress=False)
    mid = time.perf_counter()
    dedup = pipeline.run_stage(
        cfg, "dedup", {"filter": before["filter"], "signatures": sig}, plan=hw_plan, progress=False
    )
    done = time.perf_counter()
    return {
        "seconds": done - started,
        "cpu_seconds": cpu_seconds() - cpu_started,
        "steps": {
            "convert+filter (not timed)": round(convert_seconds, 2),
            "signatures": round(mid - started, 2),
            "dedup": round(done - mid, 2),
        },
        "num_proc": hw_plan.num_proc.value,
        "dedup_path": dedup.path,
        "near": dedup.report.get("near"),
    }


def moai_sets(dedup_path: str) -> tuple[set[int], dict[int, int]]:
    """(removed rows, each removed row's cluster root) from the dedup stage's dropped rows."""
    import datasets

    rows = datasets.load_from_disk(f"{dedup_path}/dropped").select_columns(["row", "detail"]).to_list()
    root = {r["row"]: int(re.match(r"near copy of row (\d+)", r["detail"]).group(1)) for r in rows}
    return set(root), root


# --- comparing --------------------------------------------------------------------------------


def clusters_from_pairs(pairs) -> dict[int, int]:
    """Each clustered document's first (smallest) member, from undirected pairs."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {x: find(x) for x in parent}


def score(root: dict[int, int], docs: list[dict], texts: list[str]) -> dict:
    """Recall over the planted copies and precision of removing every non-first cluster member."""
    from moai.clean.shingles import shingle_set

    def first(x: int) -> int:
        return root.get(x, x)

    out = {}
    for name, pick in (
        ("exact", lambda d: d["kind"] == "exact_dup"),
        ("near_ge_0.8", lambda d: d["kind"] == "near_dup" and d["jaccard"] >= THRESHOLD),
    ):
        planted = [i for i, d in enumerate(docs) if pick(d)]
        found = sum(first(i) == first(docs[i]["original"]) for i in planted)
        out[f"recall_{name}"] = round(found / len(planted), 4)
    removed = [x for x, r in root.items() if r != x]
    right = 0
    for x in removed:
        r, d = root[x], docs[x]
        if d.get("original") is not None and first(d["original"]) == r and d.get("jaccard", 1.0) >= THRESHOLD:
            right += 1
            continue
        a, b = shingle_set(texts[x], NGRAM), shingle_set(texts[r], NGRAM)
        right += len(a & b) / len(a | b) >= THRESHOLD
    out["precision"] = round(right / len(removed), 4) if removed else None
    out["removed_if_first_kept"] = len(removed)
    return out


def agreement(a: set[int], b: set[int]) -> float:
    return round(len(a & b) / len(a | b), 4) if a | b else 1.0


# --- running ----------------------------------------------------------------------------------


def contender(kind: str, args: argparse.Namespace, corpus: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"moai-dedup-{kind}-", dir=args.work))
    if kind == "datatrove":
        _split_for_datatrove(corpus / "data.jsonl", work / "input", args.dt_files)
    out = work / "result.json"
    cmd = [sys.executable, __file__, "--_run", kind, "--_corpus", str(corpus), "--_work", str(work), "--_out", str(out)]
    cmd += ["--workers", str(args.workers), "--dt-files", str(args.dt_files)]
    with open(work / "log.txt", "w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"{kind} failed (rc {done.returncode}): {work / 'log.txt'}\n" + (work / "log.txt").read_text()[-3000:])
    result = json.loads(out.read_text())
    result["work"] = str(work)
    return result


def _split_for_datatrove(data: Path, folder: Path, files: int) -> list[int]:
    """The JSONL cut into `files` consecutive pieces (datatrove gives each task whole files)."""
    lines = data.read_bytes().splitlines(keepends=True)
    folder.mkdir(parents=True)
    per = -(-len(lines) // files)
    offsets = []
    for i in range(files):
        offsets.append(min(len(lines), i * per))
        (folder / f"{i:05d}.jsonl").write_bytes(b"".join(lines[i * per : (i + 1) * per]))
    return offsets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=25_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus", type=Path, help="a folder written by clean_corpus.py (default: generate one)")
    ap.add_argument("--workers", type=int, default=2, help="processes for each contender")
    ap.add_argument("--dt-files", type=int, default=4, help="JSONL files (signature tasks) for datatrove")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs of each contender")
    ap.add_argument("--_run", help=argparse.SUPPRESS)
    ap.add_argument("--_corpus", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--_out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._run:
        runs = {
            "datatrove": lambda: run_datatrove(args._corpus, args._work, args.workers, args.dt_files),
            "moai-verify-false": lambda: run_moai(args._corpus, args._work, args.workers, verify=False),
            "moai-verify-true": lambda: run_moai(args._corpus, args._work, args.workers, verify=True),
            "moai-verify-false-seed-2": lambda: run_moai(args._corpus, args._work, args.workers, False, seed=2),
        }
        args._out.write_text(json.dumps(runs[args._run]()))
        return

    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus
    if corpus is None:
        corpus = Path(tempfile.mkdtemp(prefix="moai-dedup-corpus-", dir=args.work))
        _generator().generate(corpus, args.docs, seed=args.seed, mix="english")
    texts = [json.loads(line)["text"] for line in (corpus / "data.jsonl").open(encoding="utf-8")]
    docs = json.loads((corpus / "truth.json").read_text())["docs"]

    moais = ("moai-verify-false", "moai-verify-true", "moai-verify-false-seed-2")
    # Interleaved rounds, best of --repeats per contender: other work on the machine comes and goes.
    load_before = os.getloadavg()[0]
    results: dict[str, dict] = {}
    for _ in range(args.repeats):
        for k in ("datatrove", *moais):
            got = contender(k, args, corpus)
            if k not in results or got["seconds"] < results[k]["seconds"]:
                got, results[k] = results.get(k), got
            if got is not None:  # the slower run's scratch folder
                shutil.rmtree(got["work"], ignore_errors=True)
    dt = results["datatrove"]
    per = -(-len(texts) // args.dt_files)
    dt_removed, dt_pairs = datatrove_sets(Path(dt["work"]), [i * per for i in range(args.dt_files)])
    dt_root = clusters_from_pairs(dt_pairs)
    dt_first_kept = {x for x, r in dt_root.items() if r != x}
    report = {
        "documents": len(texts),
        "mb": round((corpus / "data.jsonl").stat().st_size / 1e6, 1),
        "workers": args.workers,
        "bands_x_rows": f"{BANDS}x{ROWS}",
        "repeats": args.repeats,
        "load_average_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "datatrove": {
            "seconds": round(dt["seconds"], 2),
            "cpu_seconds": round(dt["cpu_seconds"], 2),
            "steps": dt["steps"],
            "removed": len(dt_removed),
            "removed_if_first_kept": len(dt_first_kept),
            **score(dt_root, docs, texts),
        },
    }
    copies = {
        i
        for i, d in enumerate(docs)
        if d["kind"] == "exact_dup" or (d["kind"] == "near_dup" and d["jaccard"] >= THRESHOLD)
    }
    report["datatrove"]["removed_as_kept_equals_first_kept"] = dt_removed == dt_first_kept
    moai_removed = {}
    for k in moais:
        m = results[k]
        removed, root = moai_sets(m["dedup_path"])
        moai_removed[k] = removed
        full_root = {**{r: r for r in root.values()}, **root}
        report[k] = {
            "seconds": round(m["seconds"], 2),
            "cpu_seconds": round(m["cpu_seconds"], 2),
            "steps": m["steps"],
            "num_proc": m["num_proc"],
            "near": m["near"],
            "removed": len(removed),
            "speedup_vs_datatrove": round(dt["seconds"] / m["seconds"], 2),
            "speedup_vs_datatrove_with_filter": round((dt["seconds"] + dt["steps"]["filter"]) / m["seconds"], 2),
            "cpu_ratio_vs_datatrove": round(dt["cpu_seconds"] / m["cpu_seconds"], 2),
            "agreement_as_kept": agreement(removed, dt_removed),
            "agreement_first_kept": agreement(removed, dt_first_kept),
            "agreement_on_true_copies": agreement(removed & copies, dt_first_kept & copies),
            "agreement_on_the_rest": agreement(removed - copies, dt_first_kept - copies),
            "only_moai": len(removed - dt_first_kept),
            "only_datatrove": len(dt_first_kept - removed),
            **score(full_root, docs, texts),
        }
    # Two moai runs that differ only in the MinHash seed: how far LSH alone makes removed sets differ.
    report["moai-verify-false-seed-2"]["agreement_with_seed_1"] = agreement(
        moai_removed["moai-verify-false"], moai_removed["moai-verify-false-seed-2"]
    )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
