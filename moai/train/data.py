"""Training data: the order of samples, the datasets, and this rank's loader.

The order is a pure function of (seed, epoch, i), sharded by rank (`sample_ids`), so resuming at
step S needs only S: O(1), no batches replayed, and ranks read disjoint samples. A sample index
whose `order` is "as-stored" (format 2, written by the mix stage, already interleaved and
shuffled) is read in stored order, every epoch the same (`stored_order`); otherwise each epoch is
a seeded permutation (`epoch_order`). Costs: one order array of the split (8 bytes a sample) per
epoch, held for the epoch in progress; the datasets memory-map the stage outputs, and
`DocumentDataset` also keeps two int64 arrays with one entry per seq_len piece of a document.

- packed mode (`PackedDataset`): windows of the pack stage's sample index, every one seq_len long
  (best_fit rows are padded to it); `position_ids` restart at each document, which is what masks
  attention between documents; labels are -100 where the sample's `loss_mask` is 0 (padding);
- unpacked mode (`DocumentDataset`): one item per document, or per seq_len piece of a longer
  one, padded per micro-batch; the order groups similar lengths so little is padding.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from moai.config import TrainConfig

if TYPE_CHECKING:
    from moai.train.resolved import DataPaths


def epoch_order(
    seed: int, epoch: int, num_samples: int, lengths: np.ndarray | None = None, group: int = 0
) -> np.ndarray:
    """The order of samples in an epoch: a seeded permutation; with `lengths`, each window of
    `group` consecutive samples is sorted longest first, so a micro-batch holds similar lengths
    (little padding) while the epoch stays shuffled."""
    order = np.random.default_rng([seed, epoch]).permutation(num_samples)
    if lengths is None or group <= 1:
        return order
    for lo in range(0, num_samples, group):
        window = order[lo : lo + group]
        order[lo : lo + group] = window[np.argsort(-lengths[window], kind="stable")]
    return order


def stored_order(num_samples: int) -> np.ndarray:
    """The order of samples in every epoch of an index whose order is "as-stored": 0..n-1."""
    return np.arange(num_samples, dtype=np.int64)


def sample_order_identity(train: str | Path | PackedDataset | DocumentDataset | None) -> str:
    """What the order of training samples depends on beyond the seed and the sample count (a run
    identity entry), for a sample index folder or an open train split: "shuffle" (the trainer's
    seeded permutation), or "as-stored xxh3:<digest>", the stored order of this very train.npy. The
    digest is the one the store recorded in the folder's manifest (read, not recomputed); a folder
    without one is hashed (~1 s per GB)."""
    if train is None or isinstance(train, DocumentDataset):
        return "shuffle"
    samples = train.samples if isinstance(train, PackedDataset) else PackedDataset(str(train), "train").samples
    if samples.order != "as-stored":
        return "shuffle"
    from moai.store import FILES, MANIFEST, file_digest

    try:
        digest = json.loads((samples.path / MANIFEST).read_text())[FILES]["train.npy"]["xxh3_128"]
    except (OSError, ValueError, KeyError, TypeError):
        digest = file_digest(samples.path / "train.npy")
    return f"as-stored xxh3:{digest}"


def sample_ids(
    seed: int,
    num_samples: int,
    step: int,
    micro: int,
    rank: int,
    world: int,
    micro_batch: int,
    grad_accum: int,
    cache: dict | None = None,
    order=None,
) -> list[int]:
    """Sample indices of one micro-batch: rank `rank`'s share of micro-step `micro` of optimizer step `step`.

    Global position p of each sample runs over (step, micro, rank, j); epoch = p // num_samples and
    the sample is that epoch's order at p % num_samples. Ranks get disjoint positions.
    """
    cache = {} if cache is None else cache
    order = order or (lambda epoch: epoch_order(seed, epoch, num_samples))
    base = ((step * grad_accum + micro) * world + rank) * micro_batch
    out = []
    for p in range(base, base + micro_batch):
        epoch, i = divmod(p, num_samples)
        if epoch not in cache:
            cache.clear()
            cache[epoch] = order(epoch)
        out.append(int(cache[epoch][i]))
    return out


class PackedDataset:
    """Map-style dataset over a sample index split: item i -> input_ids, position_ids, labels."""

    lengths = None  # every sample is seq_len long: no grouping needed

    def __init__(self, pack_dir: str, split: str):
        from moai.formats.tokens import PackedSamples

        self.samples = PackedSamples(pack_dir, split)
        self.seq_len = self.samples.seq_len
        self.order = self.samples.order  # "shuffle" (format 1) or "as-stored" (a mixed index)
        self.source_names = self.samples.source_names

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        s = self.samples[i]
        ids = torch.from_numpy(s["input_ids"])
        labels = ids.clone()
        if "loss_mask" in s:  # best-fit padding, a chat store's prompt tokens: no loss
            labels[torch.from_numpy(s["loss_mask"] == 0)] = -100  # a new array: the mask itself is a read-only map
        return {"input_ids": ids, "position_ids": torch.from_numpy(s["position_ids"]), "labels": labels}

    @staticmethod
    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        return {k: torch.stack([it[k] for it in items]) for k in items[0]}


class DocumentDataset:
    """Unpacked mode (`pack.enabled: false`): item i is one document of the token store, or one
    seq_len piece of a longer one; batches are padded (see `collate`)."""

    order = "shuffle"
    source_names: ClassVar[list[str]] = ["default"]

    def __init__(self, store_dir: str, split: str, seq_len: int, pad_id: int):
        from moai.formats.tokens import TokenStore

        self.tokens = TokenStore(store_dir).split(split)
        self.seq_len, self.pad_id = seq_len, pad_id
        offs = self.tokens.doc_offsets
        doc_len = np.diff(offs)
        pieces = -(-doc_len // seq_len)
        doc = np.repeat(np.arange(len(doc_len)), pieces)
        k = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        starts = offs[:-1][doc] + k * seq_len
        lengths = np.minimum(starts + seq_len, offs[1:][doc]) - starts
        # A one-token piece has no next token to predict: it adds nothing but could make a
        # micro-batch of nothing to predict (a NaN loss), so such pieces are left out.
        keep = lengths >= 2
        self.starts, self.lengths = starts[keep], lengths[keep]
        self.dropped_tokens = int(lengths[~keep].sum())

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        start, stop = int(self.starts[i]), int(self.starts[i]) + int(self.lengths[i])
        item = {"input_ids": torch.from_numpy(self.tokens.tokens(start, stop).astype(np.int64))}
        if self.tokens.has_loss_mask:  # chat data: only assistant turns are trained on
            item["loss_mask"] = torch.from_numpy(self.tokens.loss_mask_tokens(start, stop).astype(np.int64))
        return item

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Pad to the longest item rounded up to a multiple of 8; labels -100 on padding (and where a
        chat store's loss mask is 0)."""
        import torch

        longest = max(len(it["input_ids"]) for it in items)
        width = -(-longest // 8) * 8
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        trained = torch.zeros((len(items), width), dtype=torch.long)
        for row, it in enumerate(items):
            n = len(it["input_ids"])
            ids[row, :n] = it["input_ids"]
            mask[row, :n] = 1
            trained[row, :n] = it.get("loss_mask", 1)
        labels = ids.masked_fill(trained == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


Dataset = PackedDataset | DocumentDataset


def open_data(data: DataPaths, split: str, seq_len: int, pad_id: int) -> Dataset:
    """The split as packed samples when the pack stage ran, else as documents of the token store."""
    if data.sample_index:
        return PackedDataset(data.sample_index, split)
    return DocumentDataset(data.token_store, split, seq_len, pad_id)


def num_train_samples(data: DataPaths, seq_len: int) -> int:
    """How many samples the train split has, as every rank counts them (a run identity entry);
    memory-maps the data, reads no tokens."""
    return len(open_data(data, "train", seq_len, pad_id=0))


def order_of(
    t: TrainConfig, num_samples: int, world: int, lengths: np.ndarray | None = None, order: str = "shuffle"
) -> Callable[[int], np.ndarray]:
    """epoch -> the order of samples in that epoch, as `StepBatches` reads them."""
    if order == "as-stored":
        return lambda epoch: stored_order(num_samples)
    group = StepBatches.GROUP_BATCHES * t.micro_batch_size * t.grad_accum_steps * world
    return lambda epoch: epoch_order(t.seed, epoch, num_samples, lengths, group)


class StepBatches:
    """Batch sampler for this rank from a given step on: yields lists of sample ids, O(1) to start."""

    # Length-grouping window, in global batches (unpacked mode).
    GROUP_BATCHES = 16

    def __init__(
        self,
        t: TrainConfig,
        num_samples: int,
        rank: int,
        world: int,
        start_step: int,
        lengths: np.ndarray | None = None,
        order: str = "shuffle",
    ):
        self.t, self.n, self.rank, self.world, self.start = t, num_samples, rank, world, start_step
        self.order = order_of(t, num_samples, world, lengths, order)
        self._cache: dict = {}

    def __iter__(self):
        t = self.t
        for step in range(self.start, t.max_steps):
            for micro in range(t.grad_accum_steps):
                yield sample_ids(
                    t.seed,
                    self.n,
                    step,
                    micro,
                    self.rank,
                    self.world,
                    t.micro_batch_size,
                    t.grad_accum_steps,
                    self._cache,
                    self.order,
                )

    def __len__(self) -> int:
        return (self.t.max_steps - self.start) * self.t.grad_accum_steps


class SourceTokens:
    """Tokens read from each source over the global sample positions [0, p) of a mixed index
    (what a log line's "tokens_by_source" says): exact, from the index alone, so a resumed run
    counts what the uninterrupted one did. A call costs O(samples read since the last call); the
    first after a resume at position p costs O(min(p, n)) once (whole epochs add the per-source
    totals of one epoch, counted at start). Memory: K counters, plus, for a shuffled index only,
    the epoch's order (8 bytes a sample)."""

    def __init__(
        self,
        names: list[str],
        source_ids: np.ndarray,
        lengths: np.ndarray,
        order: Callable[[int], np.ndarray] | None = None,
    ):
        self.names, self.ids, self.lengths, self.n = names, source_ids, lengths, len(source_ids)
        self.order = order  # epoch -> its order of samples; None: stored order, position p reads sample p % n
        self._epoch: tuple[int, np.ndarray] | None = None
        self.per_epoch = self._count(slice(None))
        self.position, self.counts = 0, np.zeros(len(self.names), dtype=np.int64)

    def _count(self, which: slice | np.ndarray) -> np.ndarray:
        # float64 weights are exact up to 2**53 tokens
        sums = np.bincount(self.ids[which], weights=self.lengths[which], minlength=len(self.names))
        return np.rint(sums).astype(np.int64)

    def _between(self, a: int, b: int) -> np.ndarray:
        out = np.zeros(len(self.names), dtype=np.int64)
        while a < b:
            epoch, i = divmod(a, self.n)
            j = min(self.n, i + (b - a))
            if i == 0 and j == self.n:
                out += self.per_epoch
            elif self.order is None:
                out += self._count(slice(i, j))
            else:
                if self._epoch is None or self._epoch[0] != epoch:
                    self._epoch = (epoch, self.order(epoch))
                out += self._count(self._epoch[1][i:j])
            a += j - i
        return out

    def upto(self, position: int) -> dict[str, int]:
        """Tokens per source name over positions [0, position)."""
        if position < self.position:
            self.position, self.counts = 0, np.zeros_like(self.counts)
        self.counts += self._between(self.position, position)
        self.position = position
        return {name: int(c) for name, c in zip(self.names, self.counts, strict=True)}


def source_tokens(data: Dataset, t: TrainConfig, world: int) -> SourceTokens | None:
    """The per-source token counter of a mixed index; None for one source (its lines stay as they were)."""
    if not isinstance(data, PackedDataset) or len(data.source_names) < 2:
        return None
    order = None if data.order == "as-stored" else order_of(t, len(data), world)
    return SourceTokens(data.source_names, data.samples.source_ids, data.samples.lengths, order)


def make_loader(data: Dataset, t: TrainConfig, rank: int, world: int, start_step: int, workers: int):
    """This rank's DataLoader from `start_step` on; `workers` processes read and collate ahead."""
    import torch
    from torch.utils.data import DataLoader

    return DataLoader(
        # map-style by protocol (__getitem__, __len__): the datasets do not subclass torch's Dataset,
        # so that importing moai.train loads no torch
        data,  # type: ignore[arg-type]
        batch_sampler=StepBatches(t, len(data), rank, world, start_step, data.lengths, data.order),
        collate_fn=data.collate,
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
    )


def record_first_samples(
    output_dir: Path, data: Dataset, t: TrainConfig, rank: int, world: int, start_step: int
) -> None:
    """Write `ranks/rank-<rank>.json`: the samples this rank reads first, so sharding can be checked."""
    first: list[int] = next(iter(StepBatches(t, len(data), rank, world, start_step, data.lengths, data.order)), [])
    (output_dir / "ranks").mkdir(exist_ok=True)
    (output_dir / "ranks" / f"rank-{rank}.json").write_text(
        json.dumps({"rank": rank, "world_size": world, "start_step": start_step, "first_samples": first})
    )
