"""Cold `moai prepare` (convert → pack) against the raw tokenize engines on the same texts, in one run.

    python benchmarks/prepare_e2e.py --corpus bench/instruct.jsonl \\
        --text-template $'{instruction}\\n{input}\\n{output}' --tokenizer bench/tok-tekken --rounds 2

Each contender runs in a fresh process, one after the other (interleaved over `--rounds`, so other
load on a shared machine falls on all of them alike); peak RSS is the contender process's own
`ru_maxrss` (moai: its prepare process's, to the end of tokenize; Megatron's scripts: their largest
process; datatrove and the seeds' way: their main process, workers not counted):

- moai: `moai prepare` with an empty cache (convert, filter, save, tokenizer, tokenize, pack):
  wall time end to end (JSONL MB/s) and the tokenize stage's own seconds (engine check + encoding
  + writing); with `--quarter`, the same on the first quarter of the corpus's lines too, for the
  peak-RSS ratio; with `--splits 2x1 ...`, again with tokenize's processes × threads set so;
  `--engine NAME` sets its `tokenize.engine` (default `auto`); with `--checkouts DIR ...`, again
  from each of those checkouts of moai (PYTHONPATH), in the same rounds: an A/B of two versions;
- the raw engines on the texts moai saved (loaded into memory before timing, the encode alone
  timed, all cores): fastokens `encode_batch_flat`, gigatoken's native `encode_batch` (arrays),
  the same on the Arrow text itself (`gigatoken-arrow`: awkward arrays over the Arrow buffers, no
  Python `str`), its HF-compatible call, tiktoken (the tokenizer.json translated, when it can be), `tokenizers`
  `encode_batch_fast`, and transformers' own `tokenizer(texts)`; each at every `--raw-batch` size
  (documents a call; default 500, 1000 and 10000, each its own contender, named `engine @size`: an
  engine's speed depends on it, fastokens on 2 cores took 0.81-0.87 s at 250-1000 documents a call
  and 1.0 s at 10,000 on the 601 MB corpus), the fastest of them all being "the fastest raw engine";
- `fastokens-files`: fastokens with the reading and writing any tokenize stage must do around it
  (texts out of the saved Arrow files into strings, ids and document ends into files), one step
  after the other as a plain script would, no check (not a candidate for "fastest raw");
- `fastokens-as-moai`: fastokens called the way moai's tokenize stage calls it, texts in memory,
  nothing read or written: its pool sized by `size_fastokens_pool` (one thread a call up to 2
  cores), two calls in flight on two threads, ~4 MB of text a call, EOS from its post-processor
  (not a candidate for "fastest raw" either: that is the engine as its own API runs it). Against it,
  the stage's ratio is what the reading, writing and the check cost;
- with `--datatrove`: datatrove's `DocumentTokenizer` (its `tokenizers` batch encode and token
  files; its `.metadata` files give the token count) over the same texts, one task per core;
- with `--encode-files`: gigatoken `encode_files` over a JSONL of the same texts in a "text"
  field (the call Megatron-LM's `tools/preprocess_data_fast.py` makes: JSON parsing in Rust, no
  BOS, nothing checked; MB/s of that JSONL);
- with `--old-way`: the seeds' way, `datasets.load_dataset("json")` on that JSONL, then
  `benchmarks/tokenize.py`'s old way (`.map` with the transformers tokenizer, num_proc = cores,
  batch_size 10000, then `group_texts`), the datasets cache in a fresh folder;
- with `--megatron-lm DIR`: Megatron-LM's own `tools/preprocess_data.py` (`--workers` = cores) and
  `tools/preprocess_data_fast.py` (`--use-gigatoken`) from that checkout, run as subprocesses with
  `--megatron-python` (a separate venv holding their dependencies; the checkout first on
  PYTHONPATH, as an editable install of it would put it) on that JSONL, `--append-eod`, the
  HuggingFaceTokenizer of `--tokenizer`. Their wall time includes their start (torch's import); the
  fast script's own "Elapsed time" is kept too. After the round their .bin/.idx are compared with
  transformers' ids document by document, outside the timing: `tokenizer(text)` + EOS, and the ids
  without special tokens + EOS (`--append-eod`).

With `--check-moai`, after the rounds (not timed), moai's last token store is compared with
transformers document by document, the same comparison as Megatron's (`check_ids`): every stored
document should equal `tokenizer(text)["input_ids"]` + EOS.

The JSONL of the texts moai saved, one "text" field a line, is written once before the round
(not timed). Besides the largest process's peak RSS, the whole process tree's RSS is sampled
every 50 ms (the sum; worker processes share pages, so the sum overstates).

"tokenize × fastest" is the tokenize stage's MB/s over the fastest raw engine's MB/s on the same
texts (the issue's target: ≥ 0.8); "× moai" the contender's MB/s over moai's end to end.
"""

from __future__ import annotations

import os
import sys

# This folder's tokenize.py shadows the standard library's `tokenize` when a script here runs.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CORES = os.cpu_count() or 1
RAW = [
    "fastokens",
    "gigatoken",
    "gigatoken-hf",
    "gigatoken-arrow",
    "tiktoken",
    "tokenizers",
    "transformers",
    "fastokens-files",
    "fastokens-as-moai",
]
# Not engines as their own API runs them (not the fastest raw): fastokens with a stage's reading and
# writing, done plainly; fastokens called as the stage calls it, without the reading and writing
WITH_FILES = "fastokens-files"
AS_MOAI = "fastokens-as-moai"
NOT_RAW = (WITH_FILES, AS_MOAI)


def _texts(saved: Path) -> list[str]:
    from moai.formats.text import open_split_table

    return [t for split in ("train", "validation") for t in open_split_table(saved, split).column(0).to_pylist()]


def _encoder(kind: str, tokenizer: Path):
    """(encode(batch) -> tokens in it) for a raw engine, built before timing."""
    import numpy as np

    if kind == "fastokens":
        import fastokens

        ft = fastokens.Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
        return lambda b: len(np.frombuffer(ft.encode_batch_flat(b, add_special_tokens=True)[0], dtype=np.uint32))
    if kind == "gigatoken":
        import awkward as ak
        import gigatoken

        g = gigatoken.Tokenizer(str(tokenizer))
        return lambda b: int(ak.sum(ak.num(g.encode_batch(b), axis=1)))
    if kind == "gigatoken-hf":
        import gigatoken

        hf = gigatoken.Tokenizer(str(tokenizer)).as_hf()
        return lambda b: sum(len(x) for x in hf(b)["input_ids"])
    if kind == "tiktoken":
        from moai.stages.tokenize.tiktoken import TiktokenEncoder, spec_from_tokenizer_json

        spec = spec_from_tokenizer_json((tokenizer / "tokenizer.json").read_text())
        enc = TiktokenEncoder(spec, os.cpu_count() or 1)
        return lambda b: sum(len(x) for x in enc.encode_arrays(b))
    if kind == "tokenizers":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
        return lambda b: sum(len(e) for e in tok.encode_batch_fast(b, add_special_tokens=True))
    if kind == "transformers":
        from transformers import AutoTokenizer

        hf_tok = AutoTokenizer.from_pretrained(str(tokenizer))
        return lambda b: sum(len(x) for x in hf_tok(b)["input_ids"])
    raise ValueError(kind)


def _timed(started: float, cpu_started: float, tokens: int, mb: float, **extra) -> dict:
    """A raw contender's result: wall seconds and its process's CPU seconds since the two starts."""
    return {
        "seconds": time.perf_counter() - started,
        "cpu": time.process_time() - cpu_started,
        "tokens": tokens,
        "mb": mb,
        **extra,
    }


def raw_kind(name: str) -> str:
    """The engine of a raw contender's name (`engine @size` or `engine`)."""
    return name.split(" @")[0]


def run_raw(kind: str, saved: Path, tokenizer: Path, batch: int = 10_000) -> dict:
    if kind == WITH_FILES:
        return run_fastokens_files(saved, tokenizer)
    if kind == AS_MOAI:
        return run_fastokens_as_moai(saved, tokenizer)
    if kind == "gigatoken-arrow":
        return run_gigatoken_arrow(saved, tokenizer, batch)
    texts = _texts(saved)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    encode = _encoder(kind, tokenizer)
    encode(texts[:64])  # warm-up: thread pools
    started = time.perf_counter()
    cpu_started = time.process_time()  # the process's CPU, every thread
    tokens = sum(encode(texts[i : i + batch]) for i in range(0, len(texts), batch))
    return _timed(started, cpu_started, tokens, mb, batch=batch)


def run_gigatoken_arrow(saved: Path, tokenizer: Path, batch: int) -> dict:
    """gigatoken's native call on the saved Arrow text as it is: each batch an awkward array over
    the Arrow buffers (`ak.from_arrow`, packed), made before timing; no Python `str` at all, which
    fastokens (it takes `str` only) cannot do. Its own pool, one call at a time."""
    import awkward as ak
    import gigatoken

    from moai.formats.text import open_split_table, text_bytes

    tables = [open_split_table(saved, split) for split in ("train", "validation")]
    mb = sum(float(text_bytes(t).sum()) for t in tables) / 1e6
    batches = [
        ak.to_packed(ak.from_arrow(t.column(0).slice(at, batch).combine_chunks()))
        for t in tables
        for at in range(0, t.num_rows, batch)
    ]
    g = gigatoken.Tokenizer(str(tokenizer))
    g.encode_batch(["warm-up"] * 64)  # its thread pool
    started = time.perf_counter()
    cpu_started = time.process_time()  # the process's CPU, every thread
    tokens = sum(len(g.encode_batch(b).layout.content) for b in batches)
    return _timed(started, cpu_started, tokens, mb, batch=batch)


def run_fastokens_files(saved: Path, tokenizer: Path) -> dict:
    """fastokens with the reading and writing any tokenize stage must do, one step after the other
    as a plain script would (no check, no overlap): each batch of ~4 MB of the saved text taken out
    of the Arrow files into strings, encoded (its pool of all cores, BOS/EOS from the tokenizer's
    template), its ids and document ends written to a file (page cache, no fsync, as moai's
    stage). Timed from the first read to the last write."""
    import fastokens
    import numpy as np

    from moai.formats.text import open_split_table, text_bytes

    ft = fastokens.Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    ft.encode_batch_flat(["warm-up"] * 64, add_special_tokens=True)
    out = saved.parent / "fastokens-files"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    tables = {split: open_split_table(saved, split) for split in ("train", "validation")}
    mb = sum(float(text_bytes(t).sum()) for t in tables.values()) / 1e6
    tokens = 0
    started = time.perf_counter()
    for split in ("train", "validation"):
        column = tables[split].column(0)
        with open(out / f"{split}.bin", "wb") as ids_file, open(out / f"{split}.idx", "wb") as ends_file:
            for at in range(0, len(column), 2500):  # ~4 MB of these texts
                texts = column.slice(at, 2500).to_pylist()
                ids, offsets = ft.encode_batch_flat(texts, add_special_tokens=True)
                ids_file.write(ids)
                ends_file.write((np.frombuffer(offsets, np.uint64)[1:] + tokens).astype("<i8").tobytes())
                tokens += len(ids) // 4
    seconds = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": seconds, "tokens": tokens, "mb": mb}


def run_fastokens_as_moai(saved: Path, tokenizer: Path) -> dict:
    """fastokens as the tokenize stage calls it (`AS_MOAI` in the module docstring): the stage's own
    encoder (`engines.FastokensEncoder`, EOS put in by its post-processor) and pool size, two calls
    in flight on two threads over ~4 MB batches in order, the texts in memory and no file touched.
    Timed from the first call to the last result."""
    from concurrent.futures import ThreadPoolExecutor

    from moai.stages.tokenize import engines
    from moai.stages.tokenize.engine import EncoderSetup
    from moai.stages.tokenize.parts import BATCH_MAX_BYTES
    from moai.stages.tokenizer import load_tokenizer

    texts = _texts(saved)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    eos = load_tokenizer(str(tokenizer)).eos_token_id  # the id the stage puts after every document
    engines.size_fastokens_pool(CORES)  # before the first encode, as the stage does
    setup = EncoderSetup((tokenizer / "tokenizer.json").read_text(), False, "fastokens", CORES, False, eos_id=eos)
    encoder = engines.FastokensEncoder(setup)
    encoder.ready()
    batches, batch, size = [], [], 0
    for t in texts:
        batch.append(t)
        size += len(t)
        if size >= BATCH_MAX_BYTES:
            batches.append(batch)
            batch, size = [], 0
    batches += [batch] if batch else []
    started = time.perf_counter()
    cpu_started = time.process_time()  # the process's CPU, every thread
    with ThreadPoolExecutor(engines.CALLS_IN_FLIGHT) as pool:
        tokens = sum(len(ids) for ids, _ in pool.map(lambda b: encoder.encode_documents(b, eos), batches))
    return _timed(started, cpu_started, tokens, mb)


def run_datatrove(saved: Path, tokenizer: Path, work: Path) -> dict:
    """datatrove's DocumentTokenizer (its `tokenizers` batch encode + writing its token files) over
    the same texts, as JSONL with a text field (written before timing), on all cores."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from transformers import AutoTokenizer

    texts = _texts(saved)
    cores = os.cpu_count() or 1
    data = work / "datatrove-in"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    for k in range(cores):  # one file a task
        with open(data / f"part-{k}.jsonl", "w") as f:
            for t in texts[k::cores]:
                f.write(json.dumps({"text": t}) + "\n")
    eos = AutoTokenizer.from_pretrained(str(tokenizer)).eos_token
    started = time.perf_counter()
    LocalPipelineExecutor(
        [
            JsonlReader(str(data)),
            DocumentTokenizer(
                str(work / "datatrove-out"), tokenizer_name_or_path=str(tokenizer / "tokenizer.json"), eos_token=eos
            ),
        ],
        tasks=cores,
        workers=cores,
        logging_dir=str(work / "datatrove-logs"),
    ).run()
    seconds = time.perf_counter() - started
    # each task's .metadata file: "tokenizer|token size", then its token count
    tokens = sum(int(p.read_text().splitlines()[1]) for p in (work / "datatrove-out").glob("*.metadata"))
    shutil.rmtree(work / "datatrove-out", ignore_errors=True)
    shutil.rmtree(work / "datatrove-logs", ignore_errors=True)
    return {"seconds": seconds, "tokens": tokens, "mb": sum(len(t.encode()) for t in texts) / 1e6}


def run_encode_files(texts_jsonl: Path, tokenizer: Path) -> dict:
    """gigatoken `encode_files` over a JSONL of the same texts in a "text" field (JSON parsing in Rust)."""
    import awkward as ak
    import gigatoken

    g = gigatoken.Tokenizer(str(tokenizer))
    started = time.perf_counter()
    arr = g.encode_files(gigatoken.JsonlFileSource([str(texts_jsonl)], field="text"))
    tokens = int(ak.sum(ak.num(arr, axis=1)))
    return {"seconds": time.perf_counter() - started, "tokens": tokens, "mb": texts_jsonl.stat().st_size / 1e6}


def bench_tokenize():
    """benchmarks/tokenize.py, loaded by its path (its name is the standard library's too)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("moai_bench_tokenize", Path(__file__).with_name("tokenize.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_old_way(texts_jsonl: Path, tokenizer: Path, seq_len: int, work: Path) -> dict:
    """The seeds' way: `datasets.load_dataset("json")`, then benchmarks/tokenize.py's `old_way`."""
    import datasets

    cache = work / "old-way-cache"
    shutil.rmtree(cache, ignore_errors=True)
    started = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=str(texts_jsonl), split="train", cache_dir=str(cache))
    load_seconds = time.perf_counter() - started
    r = bench_tokenize().old_way(ds, tokenizer, seq_len, CORES)
    shutil.rmtree(cache, ignore_errors=True)
    r["seconds"] += load_seconds
    r["load_seconds"] = load_seconds
    r["mb"] = texts_jsonl.stat().st_size / 1e6
    return r


MEGATRON_DTYPES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}


def read_megatron(prefix: str):
    """A Megatron IndexedDataset's (.bin tokens, .idx document lengths), read with numpy."""
    import struct

    import numpy as np

    idx = Path(prefix + ".idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00", f"{prefix}.idx: not a Megatron index"
    dtype = np.dtype(MEGATRON_DTYPES[idx[17]])
    sequences, _documents = struct.unpack("<QQ", idx[18:34])
    lengths = np.frombuffer(idx, dtype="<i4", count=sequences, offset=34)
    return np.fromfile(prefix + ".bin", dtype=dtype), lengths


def run_megatron(script: str, texts_jsonl: Path, tokenizer: Path, megatron_lm: Path, python: str, out: Path) -> dict:
    """Megatron-LM's tools/<script> from its checkout, as a user runs it, on the texts' JSONL."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # absolute paths: the scripts run in the checkout (a Partition process that cannot open its
    # input leaves preprocess_data.py waiting forever)
    cmd = [os.path.abspath(python), f"tools/{script}", "--input", str(texts_jsonl.resolve())]
    cmd += ["--output-prefix", str(out.resolve() / "megatron")]
    cmd += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer.resolve())]
    cmd += ["--json-keys", "text", "--append-eod"]
    cmd += ["--workers", str(CORES)] if script == "preprocess_data.py" else ["--use-gigatoken"]
    env = {**os.environ, "PYTHONPATH": str(megatron_lm.resolve())}
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=megatron_lm, env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{script}: no result in 30 minutes") from None
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{script}: " + (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])
    tokens, lengths = read_megatron(str(out / "megatron_text_document"))
    r = {"seconds": seconds, "tokens": len(tokens), "documents": len(lengths), "mb": texts_jsonl.stat().st_size / 1e6}
    for line in done.stdout.splitlines():  # the fast script's own figure (after its imports)
        if line.startswith("Data preprocessing is finished. Elapsed time:"):
            r["script_seconds"] = float(line.split(":")[1].split()[0])
    r["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    return r


def check_megatron(prefix: str, texts: list[str], tokenizer: Path) -> str:
    """Megatron's ids against transformers', document by document (`check_ids`)."""
    return check_ids(*read_megatron(prefix), texts, tokenizer)


def read_moai(store: str):
    """A moai token store's (tokens, document lengths), train then validation: the order of the
    saved texts (`_texts`)."""
    import numpy as np

    from moai.formats.tokens import TokenStore
    from moai.stages.tokenize import SPLITS

    opened = TokenStore(store)
    splits = [opened.split(name) for name in SPLITS if name in opened.splits]
    tokens = np.concatenate([s.tokens(0, s.num_tokens) for s in splits])
    return tokens, np.concatenate([np.diff(s.doc_offsets) for s in splits])


def check_ids(tokens, lengths, texts: list[str], tokenizer: Path) -> str:
    """Ids against transformers', document by document: `tokenizer(text)` (its template: BOS where it
    adds one) then EOS, and without special tokens then EOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    if len(lengths) != len(texts):
        return f"{len(lengths):,} documents, transformers {len(texts):,}"
    ends = lengths.cumsum()
    template = plain = 0
    first = ""
    for i in range(0, len(texts), 10_000):
        batch = texts[i : i + 10_000]
        with_template = tok(batch)["input_ids"]
        without = tok(batch, add_special_tokens=False)["input_ids"]
        for j, (want_t, want_p) in enumerate(zip(with_template, without, strict=True), start=i):
            got = tokens[ends[j] - lengths[j] : ends[j]].tolist()
            template += got == [*want_t, tok.eos_token_id]
            plain += got == [*want_p, tok.eos_token_id]
            if not first and got not in ([*want_t, tok.eos_token_id], [*want_p, tok.eos_token_id]):
                pairs = enumerate(zip(got, want_t, strict=False))
                at = next((k for k, (x, y) in pairs if x != y), min(len(got), len(want_t)))
                first = f"; first of neither: document {j}, token {at}"
    return (
        f"of {len(texts):,} documents, {template:,} equal transformers' tokenizer(text) + EOS, "
        f"{plain:,} its ids without special tokens + EOS{first}"
    )


def run_moai(
    corpus: Path,
    tokenizer: Path,
    template: str | None,
    seq_len: int,
    work: Path,
    split: str | None = None,
    engine: str = "auto",
    checkout: str | None = None,
) -> dict:
    cache = work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cfg: dict = {"cache_dir": str(cache), "source": {"path": str(corpus.resolve())}}
    cfg["tokenizer"] = {"path": str(tokenizer.resolve())}
    if template:
        cfg["source"]["text_template"] = template
    cfg["pack"] = {"seq_len": seq_len}
    cfg["tokenize"] = {"engine": engine}
    if split:  # processes x threads set in the config instead of the plan's
        procs, threads = (int(x) for x in split.split("x"))
        cfg["tokenize"].update(num_proc=procs, threads_per_proc=threads)
    path = work / "prepare.yaml"
    path.write_text(json.dumps(cfg))
    started = time.perf_counter()
    env = None if checkout is None else {**os.environ, "PYTHONPATH": str(Path(checkout).resolve())}
    out = subprocess.run(
        [sys.executable, "-m", "moai.cli", "prepare", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,  # `-m` puts the working folder first on the path: not a checkout's own folder
    )
    if out.returncode:
        raise RuntimeError(f"moai prepare exited {out.returncode}: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    seconds = time.perf_counter() - started
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    store = Path(summary["token_store"])
    report = json.loads((store / "_manifest.json").read_text())["report"]
    return {
        "seconds": seconds,
        "tokens": summary["num_tokens"],
        "mb": corpus.stat().st_size / 1e6,
        "token_store": str(store),
        "tokenize_seconds": report.get("stage_seconds", report["seconds"] + report.get("check_seconds", 0.0)),
        "tokenize_parts": {
            k: report.get(k) for k in ("seconds", "check_seconds", "check_parts", "check_sampled_ahead")
        },
        # the stage's process, its first (here only) one: CPU and wall, and seconds by kind (`Profile`)
        "tokenize_profile": (report.get("profile") or [None])[0],
        "engine": report["engine"],
        "stages": {k: v.get("seconds") for k, v in summary["stages"].items()},
        # the prepare process's own peak, up to the end of tokenize (pack holds no text); the
        # transformers process beside it is not counted
        "peak_rss_mb": report["peak_rss_mb"],
    }


def measure(args: list[str], work: Path) -> dict:
    """Run this script in a fresh process for one contender; its result (with its peak RSS), and
    the peak of its whole process tree's RSS, sampled every 50 ms."""
    with open(work / "contender.out", "w+") as out, open(work / "contender.err", "w+") as err:
        proc = subprocess.Popen([sys.executable, __file__, *args], stdout=out, stderr=err)
        tree_peak = bench_tokenize().tree_rss_peak(proc, 0.05)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            return {"error": (err.read().strip().splitlines() or ["?"])[-1][:300]}
        r = json.loads(out.read().strip().splitlines()[-1])
    r["tree_rss_mb"] = round(tree_peak / 2**20)
    return r


def saved_text(corpus: Path, tokenizer: Path, template: str | None, work: Path) -> Path:
    """moai's saved text of the corpus (the raw engines encode exactly these texts)."""
    from moai.config import parse_config
    from moai.pipeline import walk

    cfg: dict = {"cache_dir": str(work / "saved-cache"), "source": {"path": str(corpus)}}
    cfg["tokenizer"] = {"path": str(tokenizer)}
    if template:
        cfg["source"]["text_template"] = template
    results = walk(parse_config(cfg), until="save")
    return Path(results["save"].path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--text-template")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--raw", nargs="*", default=RAW, help="raw engines to run")
    parser.add_argument(
        "--raw-batch", nargs="+", type=int, default=[500, 1000, 10_000], help="documents a call for the raw engines"
    )
    parser.add_argument("--quarter", action="store_true", help="moai on the first quarter of the lines too (RSS)")
    parser.add_argument("--encode-files", action="store_true", help="gigatoken encode_files on the JSONL")
    parser.add_argument("--datatrove", action="store_true", help="datatrove's DocumentTokenizer on the texts")
    parser.add_argument("--old-way", action="store_true", help="the seeds' datasets.load_dataset + .map way")
    parser.add_argument(
        "--check-moai", action="store_true", help="moai's last token store against transformers, every document"
    )
    parser.add_argument("--megatron-lm", type=Path, help="a Megatron-LM checkout: run its preprocess scripts")
    parser.add_argument("--megatron-python", default=sys.executable, help="the python that runs Megatron's scripts")
    parser.add_argument("--splits", nargs="*", default=[], help="moai again with tokenize PxT set, e.g. 2x1")
    parser.add_argument("--engine", default="auto", help="moai's tokenize.engine (default auto)")
    parser.add_argument(
        "--checkouts", nargs="*", type=Path, default=[], help="moai again from these checkouts (an A/B in one run)"
    )
    parser.add_argument("--work", type=Path)
    parser.add_argument("--run", nargs="+", help=argparse.SUPPRESS)  # internal: one contender in this process
    args = parser.parse_args()

    if args.run:
        kind, *rest = args.run
        if kind == "moai":
            split = rest[1] if len(rest) > 1 and rest[1] != "-" else None
            checkout = rest[2] if len(rest) > 2 else None
            r = run_moai(
                args.corpus,
                args.tokenizer,
                args.text_template,
                args.seq_len,
                Path(rest[0]),
                split,
                args.engine,
                checkout,
            )
        elif kind == "encode-files":
            r = run_encode_files(Path(rest[0]), args.tokenizer)
        elif kind == "datatrove":
            r = run_datatrove(Path(rest[0]), args.tokenizer, Path(rest[1]))
        elif kind == "old-way":
            r = run_old_way(Path(rest[0]), args.tokenizer, args.seq_len, Path(rest[1]))
        elif kind == "megatron":
            assert args.megatron_lm is not None
            script, jsonl, out = rest
            r = run_megatron(script, Path(jsonl), args.tokenizer, args.megatron_lm, args.megatron_python, Path(out))
        else:
            r = run_raw(kind, Path(rest[0]), args.tokenizer, *(int(x) for x in rest[1:2]))
        r.setdefault("peak_rss_mb", round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
        print(json.dumps(r))
        return

    work = args.work or Path(tempfile.mkdtemp(prefix="moai-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        saved = saved_text(args.corpus, args.tokenizer, args.text_template, work)
        base = ["--corpus", str(args.corpus), "--tokenizer", str(args.tokenizer), "--seq-len", str(args.seq_len)]
        base += ["--engine", args.engine]
        if args.text_template:
            base += ["--text-template", args.text_template]
        if args.megatron_lm:
            base += ["--megatron-lm", str(args.megatron_lm), "--megatron-python", args.megatron_python]
        texts_jsonl = work / "texts.jsonl"
        if args.encode_files or args.old_way or args.megatron_lm:  # not timed
            with open(texts_jsonl, "w") as f:
                for t in _texts(saved):
                    f.write(json.dumps({"text": t}) + "\n")
        quarter = None
        if args.quarter:
            quarter = work / "quarter.jsonl"
            with open(args.corpus, "rb") as src:
                lines = src.readlines()
            quarter.write_bytes(b"".join(lines[: len(lines) // 4]))
            del lines
        megatron = ["preprocess_data.py", "preprocess_data_fast.py"] if args.megatron_lm else []
        rows: dict[str, list[dict]] = {}
        for _ in range(args.rounds):
            contenders: list[tuple[str, list[str]]] = [("moai", [*base, "--run", "moai", str(work / "moai")])]
            if quarter is not None:
                qbase = [*base]
                qbase[1] = str(quarter)
                contenders.append(("moai (quarter)", [*qbase, "--run", "moai", str(work / "moai-q")]))
            contenders += [(f"moai {x}", [*base, "--run", "moai", str(work / "moai"), x]) for x in args.splits]
            contenders += [
                (f"moai from {c}", [*base, "--run", "moai", str(work / "moai"), "-", str(c)]) for c in args.checkouts
            ]
            for k in args.raw:
                sizes = [[]] if k in NOT_RAW else [[str(n)] for n in args.raw_batch]  # NOT_RAW: its own batches
                for size in sizes:
                    name = k if len(sizes) == 1 else f"{k} @{size[0]}"
                    contenders.append((name, [*base, "--run", k, str(saved), *size]))
            if args.encode_files:
                contenders.append(("gigatoken encode_files", [*base, "--run", "encode-files", str(texts_jsonl)]))
            if args.datatrove:
                contenders.append(("datatrove DocumentTokenizer", [*base, "--run", "datatrove", str(saved), str(work)]))
            if args.old_way:
                old_way = [*base, "--run", "old-way", str(texts_jsonl), str(work)]
                contenders.append(("datasets.map (the seeds' way)", old_way))
            for script in megatron:
                out = str(work / f"megatron-{script}")
                mg = [*base, "--run", "megatron", script, str(texts_jsonl), out]
                contenders.append((f"Megatron-LM {script}", mg))
            for name, argv in contenders:
                (work / "moai").mkdir(exist_ok=True)
                (work / "moai-q").mkdir(exist_ok=True)
                r = measure(argv, work)
                rows.setdefault(name, []).append(r)
                print(f"{name}: {r}", file=sys.stderr, flush=True)
        checks = {}
        stores = [r["token_store"] for r in rows.get("moai", []) if r.get("token_store")]
        stores = [s for s in stores if Path(s).is_dir()]  # a later run may have removed it
        if args.check_moai and stores:  # the last round's store against transformers, not timed
            checks["moai"] = check_ids(*read_moai(stores[-1]), _texts(saved), args.tokenizer)
        for script in megatron:  # the last round's outputs against transformers, not timed
            prefix = work / f"megatron-{script}" / "megatron_text_document"
            if prefix.with_suffix(".idx").exists():
                checks[f"Megatron-LM {script}"] = check_megatron(str(prefix), _texts(saved), args.tokenizer)
        report(rows, checks)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def report(rows: dict[str, list[dict]], checks: dict[str, str]) -> None:
    def best(name: str) -> dict | None:
        ok = [r for r in rows.get(name, []) if "error" not in r]
        return min(ok, key=lambda r: r["seconds"]) if ok else None

    moai = best("moai")
    raw = {k: best(k) for k in rows if raw_kind(k) in RAW and raw_kind(k) not in NOT_RAW and best(k)}
    fastest = max(raw.values(), key=lambda r: r["mb"] / r["seconds"]) if raw else None
    print("| contender | seconds (best) | tokens | tokens/s | MB/s | × moai end to end | peak RSS MB (largest; tree) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, runs in rows.items():
        r = best(name)
        if r is None:
            print(f"| {name} | error: {runs[-1].get('error')} | | | | | |")
            continue
        mbps = r["mb"] / r["seconds"]
        x = f"{mbps / (moai['mb'] / moai['seconds']):.2f}" if moai else "–"
        secs = ", ".join(f"{x['seconds']:.2f}" for x in runs if "error" not in x)
        print(
            f"| {name} | {r['seconds']:.2f} ({secs}) | {r['tokens']:,} | {r['tokens'] / r['seconds']:,.0f} | "
            f"{mbps:.1f} | {x} | {r.get('peak_rss_mb')}; {r.get('tree_rss_mb')} |"
        )
    for name, check in checks.items():
        r = best(name)
        own = f" (the script's own time: {r['script_seconds']:.2f} s)" if r and "script_seconds" in r else ""
        print(f"{name}: {check}{own}")
    if moai and fastest:
        text_mb = fastest["mb"]
        stage = text_mb / moai["tokenize_seconds"]
        fast_name = next(k for k, v in raw.items() if v is fastest)
        print(
            f"\nmoai end to end: {moai['mb'] / moai['seconds']:.1f} MB/s of JSONL ({moai['seconds']:.2f} s, engine "
            f"{moai['engine']}); tokenize stage {moai['tokenize_seconds']:.2f} s = {stage:.1f} MB/s of text, "
            f"× fastest raw engine ({fast_name}, {text_mb / fastest['seconds']:.1f} MB/s): "
            f"{stage / (text_mb / fastest['seconds']):.2f}"
        )
        print(f"moai stages (s): {moai['stages']}; tokenize: {moai.get('tokenize_parts')}")
        for i, m in enumerate(rows.get("moai", [])):  # the same ratio within each round (load falls on both)
            same = {k: rows[k][i] for k in raw if i < len(rows[k]) and "error" not in rows[k][i]}
            if "error" in m or not same:
                continue
            f_name = min(same, key=lambda k: same[k]["seconds"])
            f = same[f_name]
            extra = ""
            for name, what in (
                (WITH_FILES, "fastokens reading and writing as a plain script"),
                (AS_MOAI, "fastokens called as the stage calls it, no I/O"),
            ):
                other = rows.get(name, [])
                if i < len(other) and "error" not in other[i]:
                    ratio = other[i]["seconds"] / m["tokenize_seconds"]
                    extra += f"; {what} ({name}) {other[i]['seconds']:.2f} s: {ratio:.2f}×"
            for name in (k for k in rows if k.startswith("moai from ")):  # the A/B's other checkouts
                other = rows[name]
                if i < len(other) and "error" not in other[i]:
                    ratio = f["seconds"] / other[i]["tokenize_seconds"]
                    extra += f"; {name}: stage {other[i]['tokenize_seconds']:.2f} s, {ratio:.2f}×"
            print(
                f"round {i + 1}: tokenize stage {m['tokenize_seconds']:.2f} s, "
                f"fastest raw ({f_name}) {f['seconds']:.2f} s: "
                f"{f['seconds'] / m['tokenize_seconds']:.2f}×{extra}"
            )
    q = best("moai (quarter)")
    if moai and q and moai.get("peak_rss_mb") and q.get("peak_rss_mb"):
        ratio = moai["peak_rss_mb"] / q["peak_rss_mb"]
        print(f"peak RSS: quarter {q['peak_rss_mb']} MB, all {moai['peak_rss_mb']} MB: {ratio:.2f}×")


if __name__ == "__main__":
    main()
