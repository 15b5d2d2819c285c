"""WebDataset export of packed samples, and a streaming loader for them.

For clusters where training reads from object storage or a shared filesystem as a stream rather
than memory-mapping the token store. Each sample of the sample index becomes one tar entry:

    <key>.tokens.bin   token ids, raw little-endian (uint16 or uint32, as in the token store)
    <key>.docs.bin     int32 lengths of the document pieces in the window (for position_ids)

plus `manifest.json` beside the shards (dtype, seq_len, samples and tokens per shard). The
loader splits shards by node and by worker (each shard is read by exactly one rank's one
worker, so together they see every sample once per epoch) and shuffles in a bounded buffer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from moai.errors import DataError
from moai.formats.tokens import PackedSamples

MANIFEST = "manifest.json"
SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """'256MB' -> 256000000; plain numbers are bytes."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size like 256MB or 1GiB")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).upper()])


def _doc_pieces(start: int, length: int, doc_offsets: np.ndarray) -> np.ndarray:
    """Lengths of the document pieces that tile tokens [start, start+length)."""
    inner = doc_offsets[(doc_offsets > start) & (doc_offsets < start + length)]
    edges = np.concatenate([[start], inner, [start + length]])
    return np.diff(edges).astype("<i4")


def export_webdataset(
    pack_dir: str | Path, out_dir: str | Path, *, split: str = "train", shard_size: str = "256MB"
) -> dict[str, Any]:
    """Write the samples of one split as tar shards `shard-00000.tar`, ...; returns the manifest."""
    import webdataset as wds

    samples = PackedSamples(pack_dir, split)
    if samples.rows:
        raise DataError(
            f"{pack_dir} is a pack.mode best_fit index (rows of whole documents with padding); export-webdataset "
            "writes concat windows only: prepare with pack.mode concat to export"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("shard-*.tar")):
        raise DataError(f"{out} already holds shards; export into an empty folder")
    # the widest of the sources' dtypes (they share a tokenizer, so they are all the same in practice)
    dtype = max((split.dtype for split in samples.token_splits), key=lambda d: d.itemsize)
    shards: list[dict[str, Any]] = []
    with wds.ShardWriter(
        str(out / "shard-%05d.tar"), maxsize=parse_size(shard_size), maxcount=10**9, verbose=0
    ) as sink:
        for i in range(len(samples)):
            k, start, length = samples.window(i)  # k: the source, in a mixed index
            split_tokens = samples.token_splits[k]
            tokens = split_tokens.tokens(start, start + length).astype(dtype, copy=False)
            sink.write(
                {
                    "__key__": f"{i:09d}",
                    "tokens.bin": tokens.tobytes(),
                    "docs.bin": _doc_pieces(start, length, split_tokens.doc_offsets).tobytes(),
                }
            )
            name = Path(sink.fname).name  # the shard this sample went to
            if not shards or shards[-1]["name"] != name:
                shards.append({"name": name, "samples": 0, "tokens": 0})
            shards[-1]["samples"] += 1
            shards[-1]["tokens"] += length
    manifest = {
        "format": "moai-webdataset/1",
        "split": split,
        "dtype": dtype.str,
        "seq_len": samples.seq_len,
        "samples": len(samples),
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def decode_sample(sample: dict[str, Any], dtype: str) -> dict[str, Any]:
    """A tar entry -> {key, input_ids, position_ids} as int64 arrays."""
    ids = np.frombuffer(sample["tokens.bin"], dtype=np.dtype(dtype)).astype(np.int64)
    pieces = np.frombuffer(sample["docs.bin"], dtype="<i4")
    positions = np.concatenate([np.arange(n) for n in pieces]) if len(pieces) else np.empty(0, dtype=np.int64)
    return {"key": sample["__key__"], "input_ids": ids, "position_ids": positions.astype(np.int64)}


def webdataset_loader(
    urls: str | Iterable[str], seq_len: int, *, dtype: str = "<u2", shuffle_buffer: int = 1000, seed: int = 0
):
    """A WebDataset over moai shards, split by node and by worker, shuffled in a bounded buffer.

    Use it as the dataset of a `torch.utils.data.DataLoader`; rank and world size come from
    torch.distributed (or RANK/WORLD_SIZE), workers from the DataLoader.
    """
    import webdataset as wds

    if not isinstance(urls, str):
        urls = list(urls)
    ds = wds.WebDataset(
        urls,
        nodesplitter=wds.split_by_node,
        workersplitter=wds.split_by_worker,
        shardshuffle=False,
        empty_check=False,
        seed=seed,
    )
    if shuffle_buffer > 1:
        ds = ds.shuffle(shuffle_buffer, rng=None)

    def decode(sample):
        out = decode_sample(sample, dtype)
        if len(out["input_ids"]) > seq_len:
            raise ValueError(f"sample {out['key']} has {len(out['input_ids'])} tokens > seq_len {seq_len}")
        return out

    return ds.map(decode)
