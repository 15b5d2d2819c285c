"""Tracing training data: from an optimizer step to the samples it read, and from each sample to
the documents (or pieces of documents) it holds, with their source, file and row.

The samples of a step come from `moai.train.data.sample_ids` with the order `order_of` gives,
exactly as the training loader's `StepBatches` reads them: the same function, never a second copy.
Step N is the step `metrics.jsonl` logs as `"step": N` (the N-th optimizer step, whose batch is
the loader's step index N - 1). A sample's documents come from the sample index (windows, or
best_fit rows of pieces) and the token split's document offsets; a document's origin from the
token store's `.origin` files and `origins.json` (`moai.formats.tokens`). Tracing a step costs one
epoch order (a permutation of the sample count: ~0.4 s of CPU per 10M samples) plus O(samples x
documents) look-ups; nothing is read that the step did not read, except the first tokens of each
document for the preview (benchmarks/trace.py: a cold `moai trace --step` at 10M samples, 0.9-1.9 s).

A run resumed on another world size (or another micro_batch_size x grad_accum_steps with the same
global batch) reads the same samples per step; which rank and micro-batch read each depends on the
launch that trained the step. `run_splits` reads each launch's split from the "start" records of
metrics.jsonl, and a step is traced with the split of the launch that trained it.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from moai.config import PipelineConfig, TrainConfig
from moai.errors import ConfigError, DataError
from moai.formats.text import split_origin
from moai.formats.tokens import TokenSplit, TokenStore

log = logging.getLogger(__name__)

PREVIEW_CHARS = 80


@dataclass
class Piece:
    """A document (or a piece of one) inside a sample."""

    source: str  # the source's name (mixing) or "default"
    document: int  # its index in the source's token split
    where: str  # its file and row, as convert names them ("data/a.jsonl:12"), or "unknown"
    file: str | None
    row: int | None
    span: tuple[int, int]  # its tokens [start, stop) in the sample
    doc_tokens: tuple[int, int]  # which of the document's tokens these are [start, stop)
    preview: str = ""


@dataclass
class Sample:
    index: int  # in the sample index split (or the unpacked dataset)
    rank: int
    micro_batch: int
    pieces: list[Piece]


@dataclass(frozen=True)
class BatchSplit:
    """How a launch split the global batch: it trained the steps after `after` (as metrics.jsonl's
    "start" record of the launch names them)."""

    after: int
    world: int
    micro_batch_size: int
    grad_accum_steps: int

    def config(self, t: TrainConfig) -> TrainConfig:
        return t.model_copy(
            update={"micro_batch_size": self.micro_batch_size, "grad_accum_steps": self.grad_accum_steps}
        )


def run_splits(t: TrainConfig, world: int | None = None) -> list[BatchSplit]:
    """Each launch's batch split, in the order of metrics.jsonl's "start" records (a record without
    the split, written before they carried it, has the config's micro-batch and accumulation).
    `world` (--world-size) overrides them all: one split, the config's. No record (the run has not
    started): the world size of ranks/rank-0.json, else 1."""
    if world is not None:
        return [BatchSplit(0, world, t.micro_batch_size, t.grad_accum_steps)]
    out = []
    for rec in _records(Path(t.output_dir) / "metrics.jsonl", containing='"start"'):
        if rec.get("event") == "start" and isinstance(rec.get("world_size"), int):
            out.append(
                BatchSplit(
                    int(rec.get("step") or 0),
                    rec["world_size"],
                    int(rec.get("micro_batch_size") or t.micro_batch_size),
                    int(rec.get("grad_accum_steps") or t.grad_accum_steps),
                )
            )
    return out or [BatchSplit(0, run_world_size(t.output_dir) or 1, t.micro_batch_size, t.grad_accum_steps)]


def split_of(splits: list[BatchSplit], step: int) -> BatchSplit:
    """The split of the launch that trained `step`: the last launch (in metrics.jsonl's order, so a
    run restarted from step 0 wins over the one before it) that started before it."""
    before = [s for s in splits if s.after < step]
    return before[-1] if before else splits[0]


def _records(path: Path, containing: str = "") -> list[dict[str, Any]]:
    """metrics.jsonl's records ([] when it is absent), only those of lines `containing` the text
    (the rest are not parsed: a long run logs ~100 bytes a step); a line that is not JSON is skipped."""
    if not path.exists():
        return []
    out = []
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if containing not in text:
            continue
        try:
            rec = json.loads(text)
        except ValueError:
            log.warning("%s:%d is not JSON; skipped", path, n)
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def step_samples(
    t: TrainConfig,
    num_samples: int,
    step: int,
    world: int,
    lengths: np.ndarray | None = None,
    order: str = "shuffle",
    rank: int | None = None,
    micro: int | None = None,
    cache: dict | None = None,
) -> list[tuple[int, int, list[int]]]:
    """(rank, micro-batch, sample indices) of optimizer step `step` (1-based, as metrics.jsonl
    counts), as the training loader reads them; only `rank` / `micro` when given. `cache`: the
    epoch order last made (`sample_ids`' cache), kept by the caller for its next step."""
    from moai.train.data import order_of, sample_ids

    if step < 1:
        raise ConfigError(f"--step {step}: steps count from 1 (metrics.jsonl's first logged step is 1)")
    ranks = range(world) if rank is None else [rank]
    micros = range(t.grad_accum_steps) if micro is None else [micro]
    for name, value, limit in (("--rank", rank, world), ("--micro-batch", micro, t.grad_accum_steps)):
        if value is not None and not 0 <= value < limit:
            raise ConfigError(f"{name} {value}: must be in 0..{limit - 1}")
    order_fn = order_of(t, num_samples, world, lengths, order)
    cache = {} if cache is None else cache
    return [
        (
            r,
            m,
            sample_ids(
                t.seed, num_samples, step - 1, m, r, world, t.micro_batch_size, t.grad_accum_steps, cache, order_fn
            ),
        )
        for r in ranks
        for m in micros
    ]


class Origins:
    """Document -> (file, row) for one token split, from its `.origin` files and origins.json."""

    def __init__(self, store: TokenStore, split: TokenSplit):
        self.origins = split.origins
        self.files = store.origin_files.get("files", [])
        self.wheres = store.origin_files.get("where", [])

    def of(self, document: int) -> tuple[str, str | None, int | None]:
        """(where, file, row) of a document; where is "unknown" for a store without origins."""
        if self.origins is None:
            return "unknown", None, None
        return where_of(int(self.origins[document]), self.files, self.wheres)


def where_of(origin: int, files: list[str], wheres: list[str | None]) -> tuple[str, str | None, int | None]:
    """(where, file, row) of an origin, as convert names rows ("data/a.jsonl:12"); "unknown" for -1."""
    if origin < 0:
        return "unknown", None, None
    file_index, row = split_origin(origin)
    file = files[file_index] if file_index < len(files) else f"file #{file_index}"
    template = wheres[file_index] if file_index < len(wheres) and wheres[file_index] else None
    where = (template or "{file}:{row}").replace("{file}", file).replace("{row}", str(row))
    return where, file, row


def _pieces_of(split: TokenSplit, start: int, stop: int, at: int) -> list[tuple[int, int, int, int]]:
    """(document, sample span start, doc token start, doc token stop) of tokens [start, stop) of a
    split laid at position `at` of a sample."""
    offs = split.doc_offsets
    out = []
    d = int(np.searchsorted(offs, start, side="right")) - 1
    while d < len(offs) - 1 and offs[d] < stop:
        lo, hi = max(int(offs[d]), start), min(int(offs[d + 1]), stop)
        out.append((d, at + lo - start, lo - int(offs[d]), hi - int(offs[d])))
        d += 1
    return out


class Tracer:
    """What the training data of a prepared config holds, step by step (see the module doc)."""

    def __init__(
        self, config: PipelineConfig, prepared: dict[str, Any], world: int | None = None, preview: bool = True
    ):
        """`world`: the world size every step was trained with (--world-size); None: each launch's
        split from metrics.jsonl (`run_splits`), read again by `read_splits`."""
        from moai.train.data import open_data
        from moai.train.resolved import DataPaths

        if config.train is None:
            raise DataError("moai trace: the config has no train section: nothing reads its samples")
        self.t = config.train
        self._world = world
        self.read_splits()
        # the epoch order of the last step traced (~0.4 s to make per 10M samples): the same
        # for every launch's split, which keep the global batch (and so the grouping window)
        self._order_cache: dict = {}
        data = DataPaths.model_validate({k: prepared[k] for k in ("sample_index", "tokenizer", "token_store")})
        self.data = open_data(data, "train", config.pack.seq_len, pad_id=0)
        self._tokenizer = _load_tokenizer(data.tokenizer) if preview else None
        samples = getattr(self.data, "samples", None)
        if samples is not None:
            self.names = samples.source_names
            pairs = zip(samples.stores, samples.token_splits, strict=True)
        else:
            self.names = ["default"]
            pairs = zip([TokenStore(data.token_store)], [self.data.tokens], strict=True)  # type: ignore[union-attr]
        self.splits, self.origins = [], []
        for store, split in pairs:
            self.splits.append(split)
            self.origins.append(Origins(store, split))

    def read_splits(self) -> None:
        """(Re)read the run's batch splits (a launch that started since adds one)."""
        self.splits_by_launch = run_splits(self.t, self._world)

    def split_of(self, step: int) -> BatchSplit:
        return split_of(self.splits_by_launch, step)

    def sample(self, i: int, rank: int = 0, micro: int = 0, preview: bool = True) -> Sample:
        """The documents of sample i of the train split (with `preview` False, no text)."""
        from moai.train.data import DocumentDataset

        found: list[tuple[int, int, int, int, int]] = []  # (source, document, span start, doc lo, doc hi)
        if isinstance(self.data, DocumentDataset):  # unpacked: a document or a seq_len piece of one
            start, length = int(self.data.starts[i]), int(self.data.lengths[i])
            found = [(0, *p) for p in _pieces_of(self.splits[0], start, start + length, 0)]
            samples = None
        elif (samples := self.data.samples).rows:
            at = 0
            for k, start, length in samples.row(i).tolist():
                found += [(k, *p) for p in _pieces_of(self.splits[k], start, start + length, at)]
                at += length
        if samples is not None and not samples.rows:
            k, start, length = samples.window(i)
            found = [(k, *p) for p in _pieces_of(self.splits[k], start, start + length, 0)]
        pieces = []
        for k, doc, at, lo, hi in found:
            where, file, row = self.origins[k].of(doc)
            pieces.append(
                Piece(
                    source=self.names[k],
                    document=doc,
                    where=where,
                    file=file,
                    row=row,
                    span=(at, at + hi - lo),
                    doc_tokens=(lo, hi),
                    preview=self.preview(k, doc, lo, hi) if preview else "",
                )
            )
        return Sample(index=i, rank=rank, micro_batch=micro, pieces=pieces)

    def preview(self, k: int, doc: int, lo: int, hi: int) -> str:
        """The first characters of tokens [lo, hi) of document `doc` of source k."""
        if self._tokenizer is None:
            return ""
        base = int(self.splits[k].doc_offsets[doc])
        # a few tokens per character are plenty for the preview's characters
        ids = self.splits[k].tokens(base + lo, base + min(hi, lo + 2 * PREVIEW_CHARS)).tolist()
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        return text[:PREVIEW_CHARS]

    def step(self, step: int, rank: int | None = None, micro: int | None = None, preview: bool = True) -> list[Sample]:
        """The samples optimizer step `step` read (1-based, as metrics.jsonl counts), in the order the
        ranks and micro-batches of the launch that trained it read them."""
        lengths = getattr(self.data, "lengths", None)
        order = getattr(self.data, "order", "shuffle")
        n = len(self.data)
        split = self.split_of(step)
        return [
            self.sample(i, r, m, preview)
            for r, m, ids in step_samples(
                split.config(self.t), n, step, split.world, lengths, order, rank, micro, self._order_cache
            )
            for i in ids
        ]

    def step_record(self, step: int, rank: int | None = None, micro: int | None = None) -> dict[str, Any]:
        """The world size that trained `step` and its samples (what `moai trace --step` prints)."""
        return {"world_size": self.split_of(step).world, "samples": self.step(step, rank, micro)}


def _load_tokenizer(folder: str):
    """The tokenizer for previews: `tokenizers` straight from tokenizer.json (no transformers import)."""
    path = Path(folder) / "tokenizer.json"
    if not path.exists():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def run_world_size(output_dir: str | Path) -> int | None:
    """The world size the run at `output_dir` trained with (its ranks/rank-0.json), if it ran."""
    file = Path(output_dir) / "ranks" / "rank-0.json"
    try:
        return int(json.loads(file.read_text())["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def top_loss_steps(metrics_file: str | Path, k: int, by: str = "loss") -> list[dict[str, Any]]:
    """The k logged training steps with the highest loss in metrics.jsonl (`by` "loss"), or the
    highest jump over the mean of the 10 logged losses before it (`by` "jump": a spike, which the
    early steps' high losses do not drown), highest first; each with its loss and jump."""
    path = Path(metrics_file)
    if not path.exists():
        raise DataError(f"{path}: no metrics.jsonl (train first, or set train.output_dir to the run's folder)")
    lines = [rec for rec in _records(path) if "loss" in rec and "step" in rec]
    out = []
    for j, rec in enumerate(lines):
        before = [r["loss"] for r in lines[max(0, j - 10) : j]]
        jump = rec["loss"] - float(np.mean(before)) if before else 0.0
        out.append({"step": int(rec["step"]), "loss": float(rec["loss"]), "jump": round(jump, 6)})
    out.sort(key=lambda r: (-r[by], r["step"]))
    return out[:k]


def sample_json(s: Sample) -> dict[str, Any]:
    return asdict(s)


def format_samples(step: int, samples: list[Sample]) -> list[str]:
    """Human-readable lines for a step's samples."""
    lines = [f"step {step}: {len(samples)} samples"]
    for s in samples:
        lines.append(f"  sample {s.index} (rank {s.rank}, micro-batch {s.micro_batch})")
        for p in s.pieces:
            lines.append(
                f"    [{p.span[0]}:{p.span[1]}] {p.source} {p.where} (document {p.document}, tokens "
                f"{p.doc_tokens[0]}-{p.doc_tokens[1]}) {p.preview!r}"
            )
    return lines


def _text_dirs(config: PipelineConfig, prepared: dict[str, Any], source: str | None) -> list[tuple[str, Path]]:
    """(stage, output folder) of a source's text stages in order: convert, filter, the cleaning
    stages that are on, save; a stage another way (dedup across several sources) is left out."""
    from moai.pipeline import node_name
    from moai.stages.chain import CHAIN, on
    from moai.store import Store

    store = Store(config.cache_dir)
    names = ["convert", *(n for n, _ in CHAIN if on(config, n)), "save"]
    out = []
    for stage in names:
        entry = prepared["stages"].get(node_name(stage, source))
        if entry is not None:
            out.append((stage, store.path(stage, entry["key"])))
    return out


def _find(folder: Path, split: str | None, origin: int) -> tuple[int, pa.Table] | None:
    """(row index, table) of the row of `origin` in a text folder (one split of it), or None."""
    from moai.formats.text import MappedTable, origins_of

    table = MappedTable(folder, split).table
    rows = np.flatnonzero(origins_of(table) == origin)
    return (int(rows[0]), table) if len(rows) else None


def _file_index(files: list[str], name: str) -> int | None:
    """Which of origins.json's files `name` is: the same string, the same resolved path, or the
    only one ending with it."""
    for i, f in enumerate(files):
        if f == name or (not f.startswith(("s3:", "gs:", "http")) and Path(f).resolve() == Path(name).resolve()):
            return i
    ends = [i for i, f in enumerate(files) if f.endswith("/" + name.lstrip("/"))]
    return ends[0] if len(ends) == 1 else None


def document_history(
    config: PipelineConfig, prepared: dict[str, Any], spec: str, world: int | None = None
) -> dict[str, Any]:
    """What happened to the row FILE:ROW (`spec`): the stages that kept it, the one that dropped it
    and why, or the token store document it became and the training samples and steps that read it."""
    import json as _json
    import re

    from moai.formats.text import ORIGIN_FILES, ROW_BITS
    from moai.sources import source_names

    m = re.fullmatch(r"(.+?)(?::(?:row )?(\d+)|\[(\d+)\])", spec.strip())
    if m is None:
        raise ConfigError(
            f"--document {spec!r}: expected FILE:ROW as moai trace --step names rows (data/a.jsonl:12, "
            "data/b.json[3], data/c.parquet:row 5)"
        )
    name, row = m.group(1), int(m.group(2) or m.group(3))
    names = source_names(config)
    sources: list[str | None] = [None] if names is None else list(names)
    for source in sources:
        dirs = _text_dirs(config, prepared, source)
        origin_file = dirs[0][1] / ORIGIN_FILES
        if not origin_file.exists():
            continue
        meta = _json.loads(origin_file.read_text())
        index = _file_index(meta["files"], name)
        if index is None:
            continue
        return _history(config, prepared, source, dirs, index << ROW_BITS | row, world, meta) | {"document": spec}
    raise DataError(f"--document {spec!r}: no source of this config reads a file named {name!r}")


def _history(config, prepared, source, dirs, origin: int, world: int | None, meta: dict[str, list]) -> dict[str, Any]:
    kept: list[dict[str, Any]] = []
    previous: tuple[int, pa.Table] | None = None
    for stage, folder in dirs:
        splits = ["train", "validation"] if stage == "save" else [None]
        found = [(s, f) for s in splits if (f := _find(folder, s, origin)) is not None]
        if not found:
            return {
                "source": source,
                "kept_by": kept,
                "dropped_by": stage,
                **_why(config, prepared, stage, folder, origin, previous, meta),
            }
        split, previous = found[0]
        kept.append({"stage": stage, "row": previous[0], **({"split": split} if split else {})})
    split, doc = kept[-1]["split"], kept[-1]["row"]
    out = {"source": source, "kept_by": kept, "split": split, "token_document": doc}
    if split == "train" and config.train is not None:
        out["read_by"] = _readers(config, prepared, source, doc, world)
    return out


def _why(config, prepared, stage: str, folder: Path, origin: int, previous, meta: dict[str, list]) -> dict[str, Any]:
    """Why `stage` dropped the row: filter's rule (asked again of the row's text), a cleaning stage's
    dropped table (with keep_dropped; a duplicate's kept copy of the same source named by file and
    row too, a contaminated row's evaluation item by its file and row), or convert: no such row, or
    a bad row skipped."""
    import re

    from moai.stages.filter import reason_masks

    if stage == "convert":
        return {"reason": "no document: no such row, or a bad row skipped (source.on_bad_rows: skip)"}
    if stage == "filter" and previous is not None:
        row, table = previous
        masks = reason_masks(config.filter, table.column(0).slice(row, 1).combine_chunks())
        reasons = [r for r, m in zip(("empty", "too_short", "too_long"), masks, strict=True) if m[0].as_py()]
        return {"reason": reasons[0] if reasons else "unknown"}
    dropped = folder / "dropped"
    if not dropped.exists():
        return {"reason": "unknown: set keep_dropped: true to keep each dropped row's reason"}
    found = _find(dropped, None, origin)
    if found is None:
        return {"reason": "unknown: not in the stage's dropped rows"}
    row, table = found
    detail = table.column("detail")[row].as_py()
    out = {"reason": table.column("reason")[row].as_py(), "detail": detail}
    # dedup: "copy of row 12", "near copy of row 12 (...)": the kept row, by its index in the stage's
    # input; "copy of ko row 12": row 12 of an earlier source's filter output (`moai.stages.dedup`)
    copy = re.match(r"(?:near )?copy of (?:(\S+) )?row (\d+)\b", detail or "")
    if copy is not None:
        other, kept_row = copy.group(1), int(copy.group(2))
        kept = _kept_copy(config, prepared, other, kept_row, previous[1] if previous else None, meta)
        out |= {"kept_copy": kept} if kept else {}
        out |= {"kept_copy_source": other} if other else {}
    # decontaminate: "shares a 13-gram with evals/x.jsonl:5": the evaluation item, as convert names rows
    leak = re.match(r"shares a \d+-gram with (.+)$", detail or "")
    if leak is not None:
        out["eval_item"] = leak.group(1)
    return out


def _kept_copy(config, prepared, source: str | None, row: int, table: pa.Table | None, meta) -> str | None:
    """file:row of the copy dedup kept: row `row` of `table` (this source's dedup input), or of
    `source`'s filter output, named by that source's origins.json."""
    import json as _json

    from moai.formats.text import ORIGIN_FILES, MappedTable, origins_of

    if source is not None:
        dirs = dict(_text_dirs(config, prepared, source))
        if "filter" not in dirs or not (dirs["convert"] / ORIGIN_FILES).exists():
            return None
        table = MappedTable(dirs["filter"]).table
        meta = _json.loads((dirs["convert"] / ORIGIN_FILES).read_text())
    if table is None or row >= table.num_rows:
        return None
    return where_of(int(origins_of(table.slice(row, 1))[0]), meta["files"], meta.get("where", []))[0]


def _readers(config, prepared, source, doc: int, world: int | None, limit: int = 20) -> dict[str, Any]:
    """The training samples that hold train document `doc` of `source`, and for each the first
    step of each epoch that reads it (as --step numbers them), with the rank and micro-batch of the
    launch that trained that step. Costs one epoch order per epoch read (at most 10), and one pass
    over the sample index."""
    from moai.train.data import DocumentDataset, order_of

    tracer = Tracer(config, prepared, world, preview=False)
    k = tracer.names.index(source) if source is not None else 0
    offs = tracer.splits[k].doc_offsets
    a, b = int(offs[doc]), int(offs[doc + 1])
    data = tracer.data
    if isinstance(data, DocumentDataset):
        hit = (data.starts < b) & (data.starts + data.lengths > a)
    elif data.samples.rows:  # best_fit: the document's pieces (one pass), then the rows holding them
        pieces = data.samples.pieces
        assert pieces is not None  # format 3 has its pieces
        starts = pieces[:, 1]
        in_doc = np.flatnonzero((starts < b) & (starts + pieces[:, 2] > a) & (pieces[:, 0] == k))
        first, count = data.samples.samples[:, 1], data.samples.samples[:, 2]
        hit = np.zeros(len(first), dtype=bool)
        for p in in_doc.tolist():
            r = int(np.searchsorted(first, p, side="right")) - 1  # rows take their pieces in order
            if r >= 0 and first[r] <= p < first[r] + count[r]:
                hit[r] = True
            else:  # an index whose rows do not: look at every row
                hit |= (first <= p) & (first + count > p)
    elif not data.samples.mixed:  # format 1: consecutive windows in token order, found by bisection
        s = data.samples
        lo = max(int(np.searchsorted(s.starts, a, side="right")) - 1, 0)
        near = np.arange(lo, int(np.searchsorted(s.starts, b, side="left")))
        hit = np.zeros(len(s), dtype=bool)
        hit[near[(s.starts[near] < b) & (s.starts[near] + s.lengths[near] > a)]] = True
    else:
        s = data.samples
        hit = (s.source_ids == k) & (s.starts < b) & (s.starts + s.lengths > a)
    samples = np.flatnonzero(hit)
    wanted = samples[:limit]
    t, n = tracer.t, len(data)
    first_split = tracer.splits_by_launch[0]
    per_step = first_split.micro_batch_size * first_split.grad_accum_steps * first_split.world  # the global batch
    epochs = -(-t.max_steps * per_step // n)
    order = order_of(t, n, first_split.world, getattr(data, "lengths", None), getattr(data, "order", "shuffle"))

    def positions(epoch: int) -> dict[int, int]:
        """Where the wanted samples sit in this epoch's order: one pass, no inverse permutation."""
        this = order(epoch)
        return {int(this[q]): int(q) for q in np.flatnonzero(np.isin(this, wanted))}

    # NumPy shuffles without the GIL: the epochs' orders are made side by side (~0.4 s each per 10M)
    with ThreadPoolExecutor(4) as pool:  # (more threads than cores only take turns)
        where = list(pool.map(positions, range(min(epochs, 10))))
    reads = []
    for epoch, at in enumerate(where):
        for i in wanted.tolist():
            g = epoch * n + at[i]
            if g >= t.max_steps * per_step:
                continue
            step, r = divmod(g, per_step)  # inverse of sample_ids' global position
            split = tracer.split_of(step + 1)
            micro, r = divmod(r, split.world * split.micro_batch_size)
            reads.append(
                {
                    "sample": i,
                    "epoch": epoch,
                    "step": step + 1,
                    "rank": r // split.micro_batch_size,
                    "micro_batch": micro,
                }
            )
    return {"samples": wanted.tolist(), "num_samples": len(samples), "reads": reads}


class LossSpikes:
    """`loss_spikes` of one run, again and again while it trains (at each eval) and at its end: the
    data is opened on the first call that finds a logged loss, and kept. Each call reads
    metrics.jsonl, traces the k steps without text, and decodes the previews of the documents it
    returns only (a few hundred tokens in all)."""

    def __init__(self, config: PipelineConfig, prepared: dict[str, Any], k: int = 3, per_step: int = 5):
        assert config.train is not None
        self.config, self.prepared, self.k, self.per_step = config, prepared, k, per_step
        self.metrics = Path(config.train.output_dir) / "metrics.jsonl"
        self.tracer: Tracer | None = None

    def __call__(self) -> list[dict[str, Any]]:
        spikes = top_loss_steps(self.metrics, self.k, by="jump") if self.metrics.exists() else []
        if not spikes:
            return []
        if self.tracer is None:
            self.tracer = Tracer(self.config, self.prepared)
        tracer = self.tracer
        tracer.read_splits()  # a launch may have started since the last call
        out = []
        for spike in spikes:
            docs: dict[tuple[int, int], dict[str, Any]] = {}
            for s in tracer.step(spike["step"], preview=False):
                for p in s.pieces:
                    k = tracer.names.index(p.source)
                    d = docs.setdefault(
                        (k, p.document),
                        {"source": p.source, "where": p.where, "tokens": 0, "_piece": (k, p.document, *p.doc_tokens)},
                    )
                    d["tokens"] += p.span[1] - p.span[0]
            top = sorted(docs.values(), key=lambda d: -d["tokens"])[: self.per_step]
            for d in top:
                d["preview"] = tracer.preview(*d.pop("_piece"))
            out.append({**spike, "documents": top, "num_documents": len(docs)})
        return out


def loss_spikes(
    config: PipelineConfig, prepared: dict[str, Any], k: int = 3, per_step: int = 5
) -> list[dict[str, Any]]:
    """The k logged steps whose loss jumped most over the 10 logged before (`top_loss_steps`), each
    with the documents that filled most of its tokens (at most `per_step`): source, where, tokens in
    the step, preview (of the first piece of it in the step). What the Prefect loss-spikes card
    shows; [] before any log."""
    return LossSpikes(config, prepared, k, per_step)()
