"""Readers for the token store and the sample index.

Token store (output of the tokenize stage), the flat layout of Megatron-LM, datatrove, nanoGPT::

    tokens.json                      format, dtype, eos_id, vocab_size, per split its parts
    <split>/part-00000.bin           token ids, little-endian uint16 (vocab ≤ 65536) or uint32
    <split>/part-00000.idx           int64 end offset of each document within the part
    <split>/part-00000.mask          uint8 per token, chat data only (tokens.json "loss_mask": true):
                                     1 where the token is trained on (assistant turns), else 0
    <split>/part-00000.origin        int64 per document: where its text came from, file index << 40 |
                                     row (-1: unknown), see `moai.formats.text`; 8 bytes a document
    origins.json                     the source's files (or hub dataset) the file indices name, and
                                     how each names a row ("{file}:{row}", "{file}[{row}]", ...)

`TokenStore(path).split("train").loss_mask(i)` gives document i's mask, aligned with
`.document(i)`; a store without masks (plain text) has `has_loss_mask` False and no mask files.
Documents follow each other in corpus order; every document ends with EOS. Parts are fixed row
ranges of the saved text (not one per worker), so the files are the same for any worker count.
Opening is O(parts): each part's file sizes are checked against tokens.json (a truncated `.bin`
would otherwise surface much later as a short sample), `.bin` files are memory-mapped, and
document offsets load on first use (8 bytes a document).

Sample index, format 1 (output of the pack stage: one source)::

    pack.json                        format "moai-sample-index/1", seq_len, mode, token_store
                                     (relative to the cache dir), splits: {name: num_samples}
    <split>.npy                      int64 (num_samples, 2): [start token, length] per sample

Sample index, format 2 (output of the mix stage: several sources)::

    pack.json                        format "moai-sample-index/2", seq_len, mode "mix",
                                     order "as-stored", sources: [{name, token_store}, ...],
                                     splits: {name: num_samples}
    <split>.npy                      int64 (num_samples, 3): [source index, start token, length]

Sample index, format 3 (`pack.mode: best_fit`, from the pack stage or the mix stage)::

    pack.json                        format "moai-sample-index/3", seq_len, mode "best_fit",
                                     order ("shuffle": one source; "as-stored": mixed), sources,
                                     splits: {name: num_samples}
    <split>.npy                      int64 (num_samples, 4): [source index, first piece,
                                     number of pieces, tokens] per row
    <split>.pieces.npy               int64 (num_pieces, 3): [source index, start token, length]

In format 3 a sample is a row of whole documents (pieces of the same source's split, laid one
after the other; only a document longer than seq_len is cut, into seq_len pieces and a tail)
padded to seq_len: `[i]` adds a `loss_mask` (1 on the row's tokens, 0 on the padding), and the
padding's `position_ids` start again at 0, so it is a document of its own that no token attends
to. `.lengths` is the tokens column (padding not counted), `.starts` the first-piece column.

In format 2 a sample is a window of the same-named split of its source's token store, and the
train samples are stored already interleaved and shuffled: training reads them in stored order
(`order` "as-stored"), where format 1 is shuffled by the trainer (`order` "shuffle"). Token store
paths are relative to the cache dir, the pack folder's parent's parent, so a moved cache still
opens. `PackedSamples(path, "train").source(i)` names the source of sample i, `.source_names` lists
them (format 1: one, `pack.json`'s "source" or "default"), `.source_ids` is the per-sample column.

A sample is a window of the split's token stream; `position_ids` restart at 0 at each document
start inside it, which is what lets the model mask attention between packed documents. Opening an
index reads its `.npy` once (memory-mapped) to check every window lies inside its token split:
O(samples), a few ms per million samples; a mismatch is `CacheError` (damaged), never a short sample.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import numpy as np

from moai.errors import CacheError

STORE_FORMAT = "moai-token-store/1"
PACK_FORMAT = "moai-sample-index/1"
MIX_FORMAT = "moai-sample-index/2"
BEST_FIT_FORMAT = "moai-sample-index/3"
ORDERS = ("shuffle", "as-stored")  # who orders the train samples: the trainer, or the index


class TokenSplit:
    """One split of a token store: a read-only view over its parts as one token stream."""

    def __init__(self, root: Path, name: str, meta: dict, dtype: np.dtype):
        self.root = root
        self.name = name
        self.dtype = dtype
        self.parts = meta["parts"]
        self.has_loss_mask = bool(self.parts) and all("mask" in p for p in self.parts)
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
            files = [
                (part["bin"], part["num_tokens"], self.dtype.itemsize, "tokens"),
                (part["idx"], part["num_documents"], 8, "documents"),
            ]
            if "mask" in part:
                files.append((part["mask"], part["num_tokens"], 1, "loss mask bytes"))
            for name, count, width, unit in files:
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
    def _masks(self) -> list[np.ndarray]:
        return [
            np.memmap(self.root / p["mask"], dtype=np.uint8, mode="r") if p["num_tokens"] else np.empty(0, np.uint8)
            for p in self.parts
        ]

    @cached_property
    def doc_offsets(self) -> np.ndarray:
        """Global token offsets of document boundaries: num_documents + 1 values, from 0 to num_tokens."""
        out = [np.zeros(1, dtype=np.int64)]
        for base, part in zip(self._part_starts, self.parts, strict=False):  # starts has one more: the end
            if part["num_documents"]:
                out.append(np.fromfile(self.root / part["idx"], dtype="<i8") + base)
        return np.concatenate(out)

    @cached_property
    def origins(self) -> np.ndarray | None:
        """Each document's origin (int64, -1: unknown), from the parts' `.origin` files; None for a
        store written before origins were kept (rebuild it: the tokenize stage's version changed)."""
        out = [np.zeros(0, dtype=np.int64)]
        for part in self.parts:
            if part["num_documents"]:
                file = self.root / (part["idx"].removesuffix(".idx") + ".origin")
                if not file.exists():
                    return None
                out.append(np.fromfile(file, dtype="<i8"))
        origins = np.concatenate(out)
        if len(origins) != self.num_documents:
            raise CacheError.damaged(
                self.root, f"the .origin files of split {self.name!r} hold {len(origins)} documents", what="token store"
            )
        return origins

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the split's stream, across part boundaries."""
        return self._read(self._bins, start, stop, self.dtype)

    def loss_mask_tokens(self, start: int, stop: int) -> np.ndarray:
        """The loss mask (uint8, 1: trained on) of tokens [start, stop); all ones in a store without masks."""
        if not self.has_loss_mask:
            if not 0 <= start <= stop <= self.num_tokens:
                raise IndexError(f"token range [{start}, {stop}) outside [0, {self.num_tokens})")
            return np.ones(stop - start, dtype=np.uint8)
        return self._read(self._masks, start, stop, np.dtype(np.uint8))

    def loss_mask(self, i: int) -> np.ndarray:
        """The loss mask of document i, aligned with `document(i)` (its EOS included, 0 in chat data)."""
        offs = self.doc_offsets
        return self.loss_mask_tokens(int(offs[i]), int(offs[i + 1]))

    def _read(self, files: list[np.ndarray], start: int, stop: int, dtype: np.dtype) -> np.ndarray:
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
                pieces.append(files[i][pos - base : end - base])
            pos = max(pos, end)
            i += 1
        if not pieces:
            return np.empty(0, dtype=dtype)
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

    @cached_property
    def origin_files(self) -> dict[str, list]:
        """origins.json: {"files": [...], "where": [...]} (empty lists for a store without one)."""
        file = self.path / "origins.json"
        return json.loads(file.read_text()) if file.exists() else {"files": [], "where": []}

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
    """Samples of one split of a sample index (format 1 or 2): `len()`, `[i] -> {input_ids,
    position_ids}`, and which source each sample comes from (`source(i)`, `source_ids`)."""

    def __init__(self, pack_dir: str | Path, split: str = "train"):
        self.path = Path(pack_dir)
        try:
            self.meta = json.loads((self.path / "pack.json").read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} is not a sample index (no pack.json)") from None
        except ValueError as err:
            raise CacheError.damaged(self.path, f"pack.json is not JSON ({err})", what="sample index") from None
        fmt = self.meta.get("format")
        if fmt not in (PACK_FORMAT, MIX_FORMAT, BEST_FIT_FORMAT):
            raise ValueError(f"{self.path}: unknown sample index format {fmt!r}")
        self.rows = fmt == BEST_FIT_FORMAT  # samples are rows of pieces (format 3), not windows
        self.mixed = fmt == MIX_FORMAT or self.rows  # a source column (format 3 has one for any count)
        self.seq_len = int(self.meta["seq_len"])
        self.split_name = split
        cache_root = self.path.parent.parent
        if self.mixed:
            sources = self.meta.get("sources")
            if not isinstance(sources, list) or not sources:
                raise CacheError.damaged(self.path, "pack.json lists no sources", what="sample index")
            self.source_names: list[str] = [str(s["name"]) for s in sources]
            refs = [s["token_store"] for s in sources]
            self.order: str = self.meta.get("order", "shuffle" if self.rows else "as-stored")
        else:
            self.source_names = [str(self.meta.get("source") or "default")]
            refs = [self.meta["token_store"]]
            self.order = "shuffle"
        if self.order not in ORDERS:
            raise CacheError.damaged(
                self.path, f"pack.json has order {self.order!r}, expected one of {list(ORDERS)}", what="sample index"
            )
        self.stores = [TokenStore(cache_root / ref) for ref in refs]
        self.token_splits = [store.split(split) for store in self.stores]
        # Format 1 names: the one store and split (format 2: the first source's).
        self.store, self.tokens = self.stores[0], self.token_splits[0]
        self.pieces = self._open_pieces(split) if self.rows else None
        self.samples = self._open_samples(split)
        width = self.samples.shape[1]
        # Columns, memory-mapped views: nothing is copied.
        self.starts, self.lengths = self.samples[:, width - 2], self.samples[:, width - 1]
        if self.rows:
            self.starts = self.samples[:, 1]
        self.source_ids: np.ndarray = (
            self.samples[:, 0] if self.mixed else np.broadcast_to(np.int64(0), (len(self.samples),))
        )

    def _open_samples(self, split: str) -> np.ndarray:
        """The split's int64 windows ((n, 2) in format 1, (n, 3) in format 2), checked against
        pack.json and each source's token split."""
        file = self.path / f"{split}.npy"
        expected = self.meta.get("splits", {}).get(split)
        width = 4 if self.rows else 3 if self.mixed else 2
        try:
            samples = np.load(file, mmap_mode="r")
        except (OSError, ValueError, EOFError) as err:  # truncated: "mmap length is greater than file size"
            raise CacheError.damaged(self.path, f"{file.name} cannot be opened ({err})", what="sample index") from None
        if (
            samples.dtype != np.int64
            or samples.ndim != 2
            or samples.shape[1] != width
            or (expected is not None and samples.shape[0] != expected)
        ):
            raise CacheError.damaged(
                self.path,
                f"{file.name} holds {samples.dtype} {samples.shape}, pack.json says int64 ({expected}, {width})",
                what="sample index",
            )
        if not len(samples):
            return samples
        if self.rows:
            return self._check_rows(file, samples)
        starts, lengths = samples[:, width - 2], samples[:, width - 1]
        if int(starts.min()) < 0 or int(lengths.min()) < 1:
            raise CacheError.damaged(
                self.path, f"{file.name} has a negative start or an empty window", what="sample index"
            )
        ends = starts + lengths
        if not self.mixed:
            self._check_end(file, 0, int(ends.max()))
            return samples
        ids = samples[:, 0]
        if int(ids.min()) < 0 or int(ids.max()) >= len(self.source_names):
            raise CacheError.damaged(
                self.path,
                f"{file.name} has source indices outside [0, {len(self.source_names)}) (pack.json lists "
                f"{len(self.source_names)} sources)",
                what="sample index",
            )
        for k in range(len(self.source_names)):
            mine = ends[ids == k]
            if len(mine):
                self._check_end(file, k, int(mine.max()))
        return samples

    def _open_pieces(self, split: str) -> np.ndarray:
        """Format 3: the split's pieces (n, 3) [source, start, length], checked against each source's split."""
        file = self.path / f"{split}.pieces.npy"
        try:
            pieces = np.load(file, mmap_mode="r")
        except (OSError, ValueError, EOFError) as err:
            raise CacheError.damaged(self.path, f"{file.name} cannot be opened ({err})", what="sample index") from None
        if pieces.dtype != np.int64 or pieces.ndim != 2 or pieces.shape[1] != 3:
            raise CacheError.damaged(
                self.path,
                f"{file.name} holds {pieces.dtype} {pieces.shape}, expected int64 (n, 3)",
                what="sample index",
            )
        if len(pieces):
            ids, starts, lengths = pieces[:, 0], pieces[:, 1], pieces[:, 2]
            if int(starts.min()) < 0 or not 1 <= int(lengths.min()) <= int(lengths.max()) <= self.seq_len:
                raise CacheError.damaged(
                    self.path, f"{file.name} has a negative start or a piece not in 1..seq_len", what="sample index"
                )
            if int(ids.min()) < 0 or int(ids.max()) >= len(self.source_names):
                raise CacheError.damaged(
                    self.path, f"{file.name} has source indices outside the sources", what="sample index"
                )
            for k in range(len(self.source_names)):
                mine = (starts + lengths)[ids == k]
                if len(mine):
                    self._check_end(file, k, int(mine.max()))
        return pieces

    def _check_rows(self, file: Path, rows: np.ndarray) -> np.ndarray:
        """Format 3: every row names pieces that exist, of its own source, adding up to its tokens."""
        assert self.pieces is not None
        first, count, tokens = rows[:, 1], rows[:, 2], rows[:, 3]
        if (
            int(first.min()) < 0
            or int(count.min()) < 1
            or int((first + count).max()) > len(self.pieces)
            or int(tokens.max()) > self.seq_len
        ):
            raise CacheError.damaged(
                self.path,
                f"{file.name} has rows outside {len(self.pieces)} pieces or over seq_len",
                what="sample index",
            )
        return rows

    def _check_end(self, file: Path, k: int, end: int) -> None:
        tokens = self.token_splits[k]
        if end > tokens.num_tokens:
            whose = f" (source {self.source_names[k]!r})" if self.mixed else ""
            raise CacheError.damaged(
                self.path,
                f"{file.name} has windows outside the {tokens.num_tokens} tokens of split {tokens.name!r} of "
                f"{self.stores[k].path}{whose}",
                what="sample index",
            )

    def __len__(self) -> int:
        return len(self.samples)

    def window(self, i: int) -> tuple[int, int, int]:
        """(source index, start token, length) of sample i (a window: formats 1 and 2)."""
        if self.rows:
            raise ValueError(f"{self.path}: a best_fit sample is a row of pieces, not one window (see .row(i))")
        if self.mixed:
            k, start, length = (int(v) for v in self.samples[i])
            return k, start, length
        start, length = (int(v) for v in self.samples[i])
        return 0, start, length

    def source(self, i: int) -> str:
        """The name of the source sample i comes from."""
        return self.source_names[int(self.source_ids[i])]

    def row(self, i: int) -> np.ndarray:
        """Format 3: the pieces (n, 3) [source, start, length] of row i, in order."""
        assert self.pieces is not None
        first, count = int(self.samples[i, 1]), int(self.samples[i, 2])
        return np.asarray(self.pieces[first : first + count])

    def _row_item(self, i: int) -> dict[str, np.ndarray]:
        ids, pos, masks = [], [], []
        for k, start, length in self.row(i).tolist():
            ids.append(self.token_splits[k].tokens(start, start + length))
            masks.append(self.token_splits[k].loss_mask_tokens(start, start + length))
            pos.append(np.arange(length, dtype=np.int64))
        used = sum(len(x) for x in ids)
        pad = self.seq_len - used
        store = self.stores[int(self.samples[i, 0])]
        ids.append(np.full(pad, store.eos_id, dtype=np.int64))
        pos.append(np.arange(pad, dtype=np.int64))  # padding: a document of its own
        masks.append(np.zeros(pad, dtype=np.uint8))
        mask = np.concatenate(masks)
        return {
            "input_ids": np.concatenate([x.astype(np.int64) for x in ids]),
            "position_ids": np.concatenate(pos),
            "loss_mask": mask,
        }

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if self.rows:
            return self._row_item(i)
        k, start, length = self.window(i)
        tokens = self.token_splits[k]
        ids = tokens.tokens(start, start + length).astype(np.int64)
        item = {"input_ids": ids, "position_ids": position_ids(start, length, tokens.doc_offsets)}
        if tokens.has_loss_mask:  # chat data: only assistant turns are trained on
            item["loss_mask"] = tokens.loss_mask_tokens(start, start + length)
        return item
