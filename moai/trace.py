"""Tracing training data: from an optimizer step to the samples it read, and from each sample to
the documents (or pieces of documents) it holds, with their source, file and row.

The samples of a step come from `moai.train.data.sample_ids` with the order `order_of` gives,
exactly as the training loader's `StepBatches` reads them: the same function, never a second copy.
Step N is the step `metrics.jsonl` logs as `"step": N` (the N-th optimizer step, whose batch is
the loader's step index N - 1). A sample's documents come from the sample index (windows, or
best_fit rows of pieces) and the token split's document offsets; a document's origin from the
token store's `.origin` files and `origins.json` (`moai.formats.tokens`). Tracing a step costs one
epoch order (a permutation of the sample count: ~0.1 s per 10M samples) plus O(samples × documents)
look-ups; nothing is read that the step did not read, except the first tokens of each document for
the preview.
"""

from __future__ import annotations

import json
import logging
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


def step_samples(
    t: TrainConfig,
    num_samples: int,
    step: int,
    world: int,
    lengths: np.ndarray | None = None,
    order: str = "shuffle",
    rank: int | None = None,
    micro: int | None = None,
) -> list[tuple[int, int, list[int]]]:
    """(rank, micro-batch, sample indices) of optimizer step `step` (1-based, as metrics.jsonl
    counts), as the training loader reads them; only `rank` / `micro` when given."""
    from moai.train.data import order_of, sample_ids

    if step < 1:
        raise ConfigError(f"--step {step}: steps count from 1 (metrics.jsonl's first logged step is 1)")
    ranks = range(world) if rank is None else [rank]
    micros = range(t.grad_accum_steps) if micro is None else [micro]
    for name, value, limit in (("--rank", rank, world), ("--micro-batch", micro, t.grad_accum_steps)):
        if value is not None and not 0 <= value < limit:
            raise ConfigError(f"{name} {value}: must be in 0..{limit - 1}")
    order_fn = order_of(t, num_samples, world, lengths, order)
    cache: dict = {}
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

    def __init__(self, config: PipelineConfig, prepared: dict[str, Any], world: int, preview: bool = True):
        from moai.train.data import open_data
        from moai.train.resolved import DataPaths

        if config.train is None:
            raise DataError("moai trace: the config has no train section: nothing reads its samples")
        self.t = config.train
        self.world = world
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

    def sample(self, i: int, rank: int = 0, micro: int = 0) -> Sample:
        """The documents of sample i of the train split."""
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
                    preview=self._preview(k, doc, lo, hi),
                )
            )
        return Sample(index=i, rank=rank, micro_batch=micro, pieces=pieces)

    def _preview(self, k: int, doc: int, lo: int, hi: int) -> str:
        if self._tokenizer is None:
            return ""
        base = int(self.splits[k].doc_offsets[doc])
        # a few tokens per character are plenty for the preview's characters
        ids = self.splits[k].tokens(base + lo, base + min(hi, lo + 2 * PREVIEW_CHARS)).tolist()
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        return text[:PREVIEW_CHARS]

    def step(self, step: int, rank: int | None = None, micro: int | None = None) -> list[Sample]:
        """The samples optimizer step `step` read (1-based, as metrics.jsonl counts), in the order the
        ranks and micro-batches read them."""
        lengths = getattr(self.data, "lengths", None)
        order = getattr(self.data, "order", "shuffle")
        n = len(self.data)
        return [
            self.sample(i, r, m)
            for r, m, ids in step_samples(self.t, n, step, self.world, lengths, order, rank, micro)
            for i in ids
        ]


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
    lines = []
    for n, text in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(text)
        except ValueError:
            log.warning("%s:%d is not JSON; skipped", path, n)
            continue
        if isinstance(rec, dict) and "loss" in rec and "step" in rec:
            lines.append(rec)
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


def document_history(config: PipelineConfig, prepared: dict[str, Any], spec: str, world: int) -> dict[str, Any]:
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


def _history(config, prepared, source, dirs, origin: int, world: int, meta: dict[str, list]) -> dict[str, Any]:
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
                **_why(config, stage, folder, origin, previous, meta),
            }
        split, previous = found[0]
        kept.append({"stage": stage, "row": previous[0], **({"split": split} if split else {})})
    split, doc = kept[-1]["split"], kept[-1]["row"]
    out = {"source": source, "kept_by": kept, "split": split, "token_document": doc}
    if split == "train" and config.train is not None:
        out["read_by"] = _readers(config, prepared, source, doc, world)
    return out


def _why(config, stage: str, folder: Path, origin: int, previous, meta: dict[str, list]) -> dict[str, Any]:
    """Why `stage` dropped the row: filter's rule (asked again of the row's text), a cleaning stage's
    dropped table (with keep_dropped; a duplicate's kept copy of the same source named by file and
    row too), or convert: no such row, or a bad row skipped."""
    import re

    from moai.formats.text import origins_of
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
    # dedup: "copy of row 12", "near copy of row 12 (...)": the kept row, by its index in the stage's input
    copy = re.match(r"(?:near )?copy of row (\d+)\b", detail or "")
    if copy is not None and previous is not None and int(copy.group(1)) < previous[1].num_rows:
        kept_origin = int(origins_of(previous[1].slice(int(copy.group(1)), 1))[0])
        out["kept_copy"] = where_of(kept_origin, meta["files"], meta.get("where", []))[0]
    return out


def _readers(config, prepared, source, doc: int, world: int, limit: int = 20) -> dict[str, Any]:
    """The training samples that hold train document `doc` of `source`, and for each the first
    step of each epoch that reads it (as --step numbers them), with the rank and micro-batch."""
    from moai.train.data import DocumentDataset, order_of

    tracer = Tracer(config, prepared, world, preview=False)
    k = tracer.names.index(source) if source is not None else 0
    offs = tracer.splits[k].doc_offsets
    a, b = int(offs[doc]), int(offs[doc + 1])
    data = tracer.data
    if isinstance(data, DocumentDataset):
        hit = (data.starts < b) & (data.starts + data.lengths > a)
    elif data.samples.rows:
        pieces = np.asarray(data.samples.pieces)
        in_doc = np.flatnonzero((pieces[:, 0] == k) & (pieces[:, 1] < b) & (pieces[:, 1] + pieces[:, 2] > a))
        first, count = np.asarray(data.samples.samples[:, 1]), np.asarray(data.samples.samples[:, 2])
        hit = np.zeros(len(first), dtype=bool)
        for p in in_doc.tolist():
            hit |= (first <= p) & (first + count > p)
    else:
        s = data.samples
        hit = (s.source_ids == k) & (s.starts < b) & (s.starts + s.lengths > a)
    samples = np.flatnonzero(hit)
    t, n = tracer.t, len(data)
    per_step = t.micro_batch_size * t.grad_accum_steps * world
    epochs = -(-t.max_steps * per_step // n)
    order = order_of(t, n, world, getattr(data, "lengths", None), getattr(data, "order", "shuffle"))
    reads = []
    for epoch in range(min(epochs, 10)):
        positions = np.empty(n, dtype=np.int64)  # sample -> its position in this epoch
        positions[order(epoch)] = np.arange(n)
        for i in samples[:limit].tolist():
            g = epoch * n + int(positions[i])
            if g >= t.max_steps * per_step:
                continue
            q, _ = divmod(g, t.micro_batch_size)  # inverse of sample_ids' global position
            q, rank = divmod(q, world)
            step, micro = divmod(q, t.grad_accum_steps)
            reads.append({"sample": i, "epoch": epoch, "step": step + 1, "rank": rank, "micro_batch": micro})
    return {"samples": samples[:limit].tolist(), "num_samples": len(samples), "reads": reads}


def loss_spikes(
    config: PipelineConfig, prepared: dict[str, Any], k: int = 3, per_step: int = 5
) -> list[dict[str, Any]]:
    """The k logged steps whose loss jumped most over the 10 logged before (`top_loss_steps`), each
    with the documents that filled most of its tokens (at most `per_step`): source, where, tokens in
    the step, preview. What the Prefect training card shows when a run ends; [] before any log."""
    assert config.train is not None
    metrics = Path(config.train.output_dir) / "metrics.jsonl"
    if not metrics.exists():
        return []
    world = run_world_size(config.train.output_dir) or 1
    tracer = Tracer(config, prepared, world)
    out = []
    for spike in top_loss_steps(metrics, k, by="jump"):
        docs: dict[tuple[str, int], dict[str, Any]] = {}
        for s in tracer.step(spike["step"]):
            for p in s.pieces:
                d = docs.setdefault(
                    (p.source, p.document), {"source": p.source, "where": p.where, "tokens": 0, "preview": p.preview}
                )
                d["tokens"] += p.span[1] - p.span[0]
        top = sorted(docs.values(), key=lambda d: -d["tokens"])[:per_step]
        out.append({**spike, "documents": top, "num_documents": len(docs)})
    return out
