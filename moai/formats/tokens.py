"""Readers for the token store and the sample index.

Token store (output of the tokenize stage), the flat layout of Megatron-LM, datatrove, nanoGPT::

    tokens.json                      format, dtype, eos_id, vocab_size, per split its parts
    <split>/part-00000.bin           token ids, little-endian uint16 (vocab ≤ 65536) or uint32
    <split>/part-00000.idx           int64 end offset of each document within the part

Documents follow each other in corpus order; every document ends with EOS. Parts are fixed row
ranges of the saved text (not one per worker), so the files are the same for any worker count.
Opening is O(parts): each part's file sizes are checked against tokens.json (a truncated `.bin`
would otherwise surface much later as a short sample), `.bin` files are memory-mapped, and
document offsets load on first use (8 bytes a document).

Sample index (output of the pack stage)::

    pack.json                        seq_len, mode, token store (relative to the cache dir), splits
    <split>.npy                      int64 (num_samples, 2): [start token, length] per sample

A sample is a window of the split's token stream; `position_ids` restart at 0 at each document
start inside it, which is what lets the model mask attention between packed documents.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import numpy as np

from moai.errors import CacheError

STORE_FORMAT = "moai-token-store/1"
PACK_FORMAT = "moai-sample-index/1"


class TokenSplit:
    """One split of a token store: a read-only view over its parts as one token stream."""

    def __init__(self, root: Path, name: str, meta: dict, dtype: np.dtype):
        self.root = root
        self.name = name
        self.dtype = dtype
        self.parts = meta["parts"]
        self.num_tokens = int(meta["num_tokens"])
        self.num_documents = int(meta["num_documents"])
        self._part_starts = np.concatenate([[0], np.cumsum([p["num_tokens"] for p in self.parts])]).astype(np.int64)
        self._check_sizes()

    def _check_sizes(self) -> None:
        """Every part's files hold exactly what tokens.json says: `stat` only, O(parts)."""
        documents = sum(p["num_documents"] for p in self.parts)
        if int(self._part_starts[-1]) != self.num_tokens or documents != self.num_documents:
            raise CacheError.damaged(
                self.root,
                f"tokens.json: the parts of split {self.name!r} do not add up to its num_tokens/num_documents",
                what="token store",
            )
        for part in self.parts:
            for name, count, width, unit in (
                (part["bin"], part["num_tokens"], self.dtype.itemsize, "tokens"),
                (part["idx"], part["num_documents"], 8, "documents"),
            ):
                expected = count * width
                try:
                    size = (self.root / name).stat().st_size
                except FileNotFoundError:
                    if expected == 0:  # an empty part may have no files
                        continue
                    raise CacheError.damaged(self.root, f"{name} is missing", what="token store") from None
                if size != expected:
                    raise CacheError.damaged(
                        self.root,
                        f"{name} has {size} bytes, tokens.json says {count} {unit} of {width} bytes ({expected})",
                        what="token store",
                    )

    def _bin(self, i: int) -> np.ndarray:
        part = self.parts[i]
        if part["num_tokens"] == 0:
            return np.empty(0, dtype=self.dtype)
        return np.memmap(self.root / part["bin"], dtype=self.dtype, mode="r")

    @cached_property
    def _bins(self) -> list[np.ndarray]:
        return [self._bin(i) for i in range(len(self.parts))]

    @cached_property
    def doc_offsets(self) -> np.ndarray:
        """Global token offsets of document boundaries: num_documents + 1 values, from 0 to num_tokens."""
        out = [np.zeros(1, dtype=np.int64)]
        for base, part in zip(self._part_starts, self.parts, strict=False):  # starts has one more: the end
            if part["num_documents"]:
                out.append(np.fromfile(self.root / part["idx"], dtype="<i8") + base)
        return np.concatenate(out)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the split's stream, across part boundaries."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"token range [{start}, {stop}) outside [0, {self.num_tokens})")
        first = int(np.searchsorted(self._part_starts, start, side="right")) - 1
        pieces = []
        pos = start
        i = max(first, 0)
        while pos < stop:
            base = self._part_starts[i]
            end = min(stop, self._part_starts[i + 1])
            if end > pos:
                pieces.append(self._bins[i][pos - base : end - base])
            pos = max(pos, end)
            i += 1
        if not pieces:
            return np.empty(0, dtype=self.dtype)
        return np.concatenate(pieces) if len(pieces) > 1 else np.asarray(pieces[0])

    def document(self, i: int) -> np.ndarray:
        """Token ids of document i (its EOS included)."""
        offs = self.doc_offsets
        return self.tokens(int(offs[i]), int(offs[i + 1]))


class TokenStore:
    """A published token store. `TokenStore(path).split("train").document(0)` gives its first document."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        meta_file = self.path / "tokens.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"{self.path} is not a token store (no tokens.json)")
        self.meta = json.loads(meta_file.read_text())
        if self.meta.get("format") != STORE_FORMAT:
            raise ValueError(f"{self.path}: unknown token store format {self.meta.get('format')!r}")
        self.dtype = np.dtype(self.meta["dtype"]).newbyteorder("<")
        self.eos_id = int(self.meta["eos_id"])
        self.vocab_size = int(self.meta["vocab_size"])

    @property
    def splits(self) -> list[str]:
        return list(self.meta["splits"])

    def split(self, name: str) -> TokenSplit:
        if name not in self.meta["splits"]:
            raise KeyError(f"{self.path}: no split {name!r} (splits: {self.splits})")
        return TokenSplit(self.path, name, self.meta["splits"][name], self.dtype)


def position_ids(window_start: int, length: int, doc_offsets: np.ndarray) -> np.ndarray:
    """Positions for tokens [window_start, window_start+length): restart at 0 at each document start."""
    idx = np.arange(window_start, window_start + length, dtype=np.int64)
    # The document each token belongs to starts at the last offset <= token index.
    doc_start = doc_offsets[np.searchsorted(doc_offsets, idx, side="right") - 1]
    return idx - np.maximum(doc_start, window_start)


class PackedSamples:
    """Samples of one split of a pack stage output: `len()` and `[i] -> {input_ids, position_ids}`."""

    def __init__(self, pack_dir: str | Path, split: str = "train"):
        self.path = Path(pack_dir)
        self.meta = json.loads((self.path / "pack.json").read_text())
        if self.meta.get("format") != PACK_FORMAT:
            raise ValueError(f"{self.path}: unknown sample index format {self.meta.get('format')!r}")
        self.seq_len = int(self.meta["seq_len"])
        cache_root = self.path.parent.parent
        self.store = TokenStore(cache_root / self.meta["token_store"])
        self.tokens = self.store.split(split)
        self.samples = self._open_samples(split)

    def _open_samples(self, split: str) -> np.ndarray:
        """The split's (num_samples, 2) int64 windows, checked against pack.json and the token split."""
        file = self.path / f"{split}.npy"
        expected = self.meta.get("splits", {}).get(split)
        try:
            samples = np.load(file, mmap_mode="r")
        except (OSError, ValueError, EOFError) as err:  # truncated: "mmap length is greater than file size"
            raise CacheError.damaged(self.path, f"{file.name} cannot be opened ({err})", what="sample index") from None
        if (
            samples.dtype != np.int64
            or samples.ndim != 2
            or samples.shape[1] != 2
            or (expected is not None and samples.shape[0] != expected)
        ):
            raise CacheError.damaged(
                self.path,
                f"{file.name} holds {samples.dtype} {samples.shape}, pack.json says int64 ({expected}, 2)",
                what="sample index",
            )
        if len(samples):
            starts, lengths = samples[:, 0], samples[:, 1]
            end = int((starts + lengths).max())
            if int(starts.min()) < 0 or int(lengths.min()) < 1 or end > self.tokens.num_tokens:
                raise CacheError.damaged(
                    self.path,
                    f"{file.name} has windows outside the {self.tokens.num_tokens} "
                    f"tokens of split {split!r} of {self.store.path}",
                    what="sample index",
                )
        return samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        start, length = (int(v) for v in self.samples[i])
        ids = self.tokens.tokens(start, start + length).astype(np.int64)
        return {"input_ids": ids, "position_ids": position_ids(start, length, self.tokens.doc_offsets)}
