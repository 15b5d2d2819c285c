"""Training entry point: `python -m moai.train --config RESOLVED.json` (what `accelerate launch` runs).

setup → train → close, on Accelerate:

- data: packed samples of the sample index (memory-mapped), in an order that is a pure function
  of (seed, epoch, i) and sharded by rank (`sample_ids`), so resuming needs only the step count:
  O(1), no batches replayed. `position_ids` restart at each document and `use_cache=False`, so
  attention stops at document boundaries (transformers applies that masking only then);
- speed: bf16 autocast on GPU, TF32, SDPA, optional torch.compile, fused AdamW on CUDA,
  gradient accumulation, cosine schedule with warm-up, gradient clipping;
- checkpoints every `save_every` steps (model + tokenizer via save_pretrained, optimizer,
  scheduler, RNG states, samples consumed), the last `keep_last` kept, published by rename; a
  rerun with the same output_dir resumes from the newest one;
- metrics: one JSON line per `log_every` steps on stdout and in `<output_dir>/metrics.jsonl`; a
  run starting at step S first drops the lines after S (written after the checkpoint it resumes
  from, before a kill), so each step appears once.

RESOLVED.json is written by `moai.launch.resolve`: the pipeline config plus the data paths.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moai.config import PipelineConfig, TrainConfig

log = logging.getLogger(__name__)

# Dense bf16 peak FLOP/s by GPU name (PaLM/torchtitan MFU convention).
PEAK_BF16 = [("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12), ("L40S", 362e12),
             ("A10G", 125e12), ("4090", 165e12)]


# -- data order: a pure function of (seed, epoch, i) -----------------------------------------------

def epoch_order(seed: int, epoch: int, num_samples: int, lengths: np.ndarray | None = None,
                group: int = 0) -> np.ndarray:
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


def sample_ids(seed: int, num_samples: int, step: int, micro: int, rank: int, world: int, micro_batch: int,
               grad_accum: int, cache: dict | None = None, order=None) -> list[int]:
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
    """Map-style dataset over a pack stage split: item i -> input_ids, position_ids, labels."""

    lengths = None  # every sample is seq_len long: no grouping needed

    def __init__(self, pack_dir: str, split: str):
        from moai.tokens import PackedSamples

        self.samples = PackedSamples(pack_dir, split)
        self.seq_len = self.samples.seq_len

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        s = self.samples[i]
        ids = torch.from_numpy(s["input_ids"])
        return {"input_ids": ids, "position_ids": torch.from_numpy(s["position_ids"]), "labels": ids.clone()}

    @staticmethod
    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        return {k: torch.stack([it[k] for it in items]) for k in items[0]}


class DocumentDataset:
    """Unpacked mode (`pack.enabled: false`): item i is one document of the token store, or one
    seq_len piece of a longer one; batches are padded (see `collate`)."""

    def __init__(self, store_dir: str, split: str, seq_len: int, pad_id: int):
        from moai.tokens import TokenStore

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

        start = int(self.starts[i])
        return {"input_ids": torch.from_numpy(self.tokens.tokens(start, start + int(self.lengths[i])).astype(np.int64))}

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Pad to the longest item rounded up to a multiple of 8; labels -100 on padding."""
        import torch

        longest = max(len(it["input_ids"]) for it in items)
        width = -(-longest // 8) * 8
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, it in enumerate(items):
            n = len(it["input_ids"])
            ids[row, :n] = it["input_ids"]
            mask[row, :n] = 1
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def open_data(data_paths: dict[str, Any], split: str, seq_len: int, pad_id: int):
    if data_paths.get("sample_index"):
        return PackedDataset(data_paths["sample_index"], split)
    return DocumentDataset(data_paths["token_store"], split, seq_len, pad_id)


class StepBatches:
    """Batch sampler for this rank from a given step on: yields lists of sample ids, O(1) to start."""

    # Length-grouping window, in global batches (unpacked mode).
    GROUP_BATCHES = 16

    def __init__(self, t: TrainConfig, num_samples: int, rank: int, world: int, start_step: int,
                 lengths: np.ndarray | None = None):
        self.t, self.n, self.rank, self.world, self.start = t, num_samples, rank, world, start_step
        group = self.GROUP_BATCHES * t.micro_batch_size * t.grad_accum_steps * world
        self.order = lambda epoch: epoch_order(t.seed, epoch, num_samples, lengths, group)
        self._cache: dict = {}

    def __iter__(self):
        t = self.t
        for step in range(self.start, t.max_steps):
            for micro in range(t.grad_accum_steps):
                yield sample_ids(t.seed, self.n, step, micro, self.rank, self.world, t.micro_batch_size,
                                 t.grad_accum_steps, self._cache, self.order)

    def __len__(self) -> int:
        return (self.t.max_steps - self.start) * self.t.grad_accum_steps


# -- model ----------------------------------------------------------------------------------------

def attention_kind(t: TrainConfig, cuda: bool, packed: bool) -> str:
    """Packed rows carry document boundaries in position_ids; with SDPA, transformers turns them
    into a block-diagonal mask and SDPA loses its flash kernel (1.1B Llama on an H100: 40% MFU),
    while flex_attention keeps document masking at near-flash speed (47%)."""
    if t.attn_implementation:
        return t.attn_implementation
    return "flex_attention" if cuda and packed else "sdpa"


def build_model(t: TrainConfig, vocab_size: int, tokenizer, attn: str = "sdpa"):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if t.mode == "continue":
        model = AutoModelForCausalLM.from_pretrained(t.init_from, attn_implementation=attn,
                                                     dtype=torch.float32)
        if model.config.vocab_size < vocab_size:
            raise ValueError(f"train.init_from {t.init_from}: vocab {model.config.vocab_size} < tokenizer's {vocab_size}")
        return model
    if isinstance(t.model, str):
        cfg = AutoConfig.from_pretrained(t.model)
    else:
        spec = dict(t.model)
        model_type = spec.pop("model_type", None)
        if model_type is None:
            raise ValueError("train.model_config needs model_type (llama, qwen2, qwen3, ...)")
        cfg = AutoConfig.for_model(model_type, **spec)
    cfg.vocab_size = vocab_size
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        setattr(cfg, name, getattr(tokenizer, name, None))
    cfg.use_cache = False
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)


def flops_per_token(model_config, num_params: int, seq_len: int) -> float:
    """PaLM: 6·N(non-embedding) + 12·L·H·Q·T."""
    c = model_config
    embed = c.vocab_size * c.hidden_size * (1 if getattr(c, "tie_word_embeddings", False) else 2)
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return 6 * (num_params - embed) + 12 * c.num_hidden_layers * heads * head_dim * seq_len


def peak_flops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, value in PEAK_BF16:
        if key in device_name:
            return value
    return None


# -- checkpoints ------------------------------------------------------------------------------------

@dataclass
class TrainState:
    step: int = 0
    samples_consumed: int = 0
    tokens_consumed: int = 0
    # What the order of samples depends on: a resumed run must match, or it would not be exact.
    run: dict[str, Any] | None = None


def run_identity(t: TrainConfig, world: int, seq_len: int, num_samples: int) -> dict[str, Any]:
    return {"seed": t.seed, "micro_batch_size": t.micro_batch_size, "grad_accum_steps": t.grad_accum_steps,
            "world_size": world, "seq_len": seq_len, "train_samples": num_samples, "max_steps": t.max_steps}


def checkpoints(output_dir: Path) -> list[Path]:
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.name.startswith("step-") and (p / "state.json").is_file()),
                  key=lambda p: int(p.name.split("-")[1]))


def save_checkpoint(accelerator, model, optimizer, scheduler, tokenizer, state: TrainState, t: TrainConfig) -> Path:
    """Save everything a resume needs; `model` is the plain module (not DDP-wrapped or compiled)."""
    import torch

    out = Path(t.output_dir)
    final = out / "checkpoints" / f"step-{state.step:08d}"
    tmp = out / "checkpoints" / f".tmp-step-{state.step:08d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
               tmp / f"rng-{accelerator.process_index}.pt")
    if accelerator.is_main_process:
        model.save_pretrained(tmp / "model", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "model")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / "state.json").write_text(json.dumps(state.__dict__))
        os.rename(tmp, final)
        for old in checkpoints(out)[: -t.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(path: Path, accelerator, unwrapped, optimizer, scheduler, expected: dict[str, Any]) -> TrainState:
    import torch
    from safetensors.torch import load_file

    state = TrainState(**json.loads((path / "state.json").read_text()))
    if state.run is not None and state.run != expected:
        diff = {k: (state.run.get(k), v) for k, v in expected.items() if state.run.get(k) != v}
        raise ValueError(
            f"{path.parent.parent} holds a run with other settings {diff} (checkpoint, now); an exact resume needs "
            "the same ones: restore them, or give train.output_dir a new folder"
        )
    weights = {}
    for f in sorted((path / "model").glob("*.safetensors")):
        weights.update(load_file(str(f)))
    missing, unexpected = unwrapped.load_state_dict(weights, strict=False)
    # Tied embeddings are saved once; anything else missing is a real mismatch.
    missing = [k for k in missing if not (k == "lm_head.weight" and unwrapped.config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    rng_file = path / f"rng-{accelerator.process_index}.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    return state


# -- the loop -------------------------------------------------------------------------------------

def cosine_with_warmup(optimizer, t: TrainConfig):
    import torch

    def factor(step: int) -> float:
        if step < t.warmup_steps:
            return (step + 1) / (t.warmup_steps + 1)
        progress = (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps)
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def kept_metrics(lines: list[str], step: int) -> list[str]:
    """The metrics lines a run resuming at `step` keeps: those with a step <= `step`, and lines
    without one (events) that come before the first dropped line. Lines that are not a JSON object
    (one half-written by a kill) are dropped: they would also glue onto the next line appended."""
    kept: list[str] = []
    dropping = False
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            dropping = True
            continue
        at = record.get("step")
        if isinstance(at, (int, float)) and not isinstance(at, bool):
            if at <= step:
                kept.append(line)
            else:
                dropping = True
        elif not dropping:
            kept.append(line)
    return kept


def trim_metrics(path: Path, step: int) -> int:
    """Rewrite `path` with `kept_metrics(step)`; return how many lines were dropped. Written to a
    temporary file and renamed over it, so a kill during the rewrite leaves the old file whole."""
    if not path.is_file():
        return 0
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    kept = kept_metrics(lines, step)
    if not text or (len(kept) == len(lines) and text.endswith("\n")):
        return 0  # nothing to drop; a last line without its newline is rewritten with one
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(lines) - len(kept)


class MetricsWriter:
    def __init__(self, accelerator, output_dir: Path):
        self.accelerator = accelerator
        self.file = open(output_dir / "metrics.jsonl", "a") if accelerator.is_main_process else None

    def write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            return
        line = json.dumps(record)
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step" and v is not None}
        if numbers:
            self.accelerator.log(numbers, step=record["step"])

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def evaluate(model, accelerator, data: PackedDataset | None, t: TrainConfig) -> float | None:
    import torch

    if data is None or len(data) == 0:
        return None
    model.eval()
    world, rank = accelerator.num_processes, accelerator.process_index
    total, count = torch.zeros((), device=accelerator.device), torch.zeros((), device=accelerator.device)
    with torch.no_grad():
        for b in range(t.eval_batches):
            ids = [i for i in range((b * world + rank) * t.micro_batch_size,
                                    (b * world + rank + 1) * t.micro_batch_size) if i < len(data)]
            if not ids:
                break
            batch = {k: v.to(accelerator.device) for k, v in data.collate([data[i] for i in ids]).items()}
            with accelerator.autocast():
                out = model(**batch, use_cache=False)
            total += out.loss.float() * len(ids)
            count += len(ids)
    model.train()
    total, count = accelerator.reduce(total, "sum"), accelerator.reduce(count, "sum")
    return float(total / count) if count > 0 else None


def train(resolved: dict[str, Any]) -> dict[str, Any]:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import AutoTokenizer

    config = PipelineConfig.model_validate(resolved["config"])
    t = config.train
    data_paths = resolved["data"]
    out = Path(t.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    mixed = t.mixed_precision or ("bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no")
    tracker = None if t.tracker == "none" else t.tracker
    if tracker == "mlflow":
        import importlib.util

        if importlib.util.find_spec("mlflow") is None:
            raise ValueError("train.tracker mlflow needs the mlflow package (pip install mlflow); "
                             "MLFLOW_TRACKING_URI picks the server")
    accelerator = Accelerator(mixed_precision=mixed, log_with=tracker, project_dir=str(out))
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    set_seed(t.seed)  # same initial weights on every rank

    tokenizer = AutoTokenizer.from_pretrained(data_paths["tokenizer"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    train_data = open_data(data_paths, "train", config.pack.seq_len, pad_id)
    val_data = open_data(data_paths, "validation", config.pack.seq_len, pad_id)
    seq_len = train_data.seq_len
    attn = attention_kind(t, torch.cuda.is_available(), isinstance(train_data, PackedDataset))
    model = build_model(t, len(tokenizer), tokenizer, attn)
    num_params = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(model.config, num_params, seq_len)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    fused = {"fused": True} if torch.cuda.is_available() else {}
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=t.lr, betas=(0.9, 0.95), **fused)
    scheduler = cosine_with_warmup(optimizer, t)
    model, optimizer = accelerator.prepare(model, optimizer)
    raw_model = accelerator.unwrap_model(model)  # for checkpoints: no DDP or compile wrapper in the names

    world, rank = accelerator.num_processes, accelerator.process_index
    identity = run_identity(t, world, seq_len, len(train_data))
    state = TrainState(run=identity)
    found = checkpoints(out)
    if found:
        state = load_checkpoint(found[-1], accelerator, raw_model, optimizer, scheduler, identity)
        state.run = identity
        log.info("resumed from %s at step %d", found[-1], state.step)
    if accelerator.is_main_process:
        # Before the first new line: a run killed after its last checkpoint logged steps it will redo.
        dropped = trim_metrics(out / "metrics.jsonl", state.step)
        if dropped:
            log.info("metrics.jsonl: dropped %d line(s) after step %d, logged before the previous run stopped; "
                     "this run logs those steps again", dropped, state.step)
    if t.compile:
        model = torch.compile(model)
    if tracker:
        accelerator.init_trackers("moai", config={"max_steps": t.max_steps, "lr": t.lr, "seq_len": seq_len})

    from torch.utils.data import DataLoader

    workers = resolved.get("loader_workers", 0)
    loader = DataLoader(train_data, batch_sampler=StepBatches(t, len(train_data), rank, world, state.step,
                                                              train_data.lengths),
                        collate_fn=train_data.collate, num_workers=workers, pin_memory=torch.cuda.is_available(),
                        persistent_workers=workers > 0, prefetch_factor=4 if workers > 0 else None)
    first = next(iter(StepBatches(t, len(train_data), rank, world, state.step, train_data.lengths)), [])
    (out / "ranks").mkdir(exist_ok=True)
    (out / "ranks" / f"rank-{rank}.json").write_text(json.dumps(
        {"rank": rank, "world_size": world, "start_step": state.step, "first_samples": first}))

    device_name = torch.cuda.get_device_name(accelerator.device) if torch.cuda.is_available() else None
    peak = peak_flops(device_name)
    metrics = MetricsWriter(accelerator, out)
    metrics.write({"event": "start", "step": state.step, "world_size": world, "parameters": num_params,
                   "train_samples": len(train_data), "seq_len": seq_len, "device": device_name or "cpu",
                   "mixed_precision": mixed, "attention": attn, "resumed": bool(found)})
    stop_at = min(t.max_steps, state.step + t.stop_after_steps) if t.stop_after_steps else t.max_steps

    model.train()
    window_start = time.perf_counter()
    window_tokens = torch.zeros((), device=accelerator.device, dtype=torch.float64)
    batches = iter(loader)
    last: dict[str, Any] = {}
    while state.step < stop_at:
        loss_sum = torch.zeros((), device=accelerator.device)
        for micro in range(t.grad_accum_steps):
            batch = {k: v.to(accelerator.device, non_blocking=True) for k, v in next(batches).items()}
            # real tokens only: padding (unpacked mode) is not work done
            window_tokens += batch["attention_mask"].sum() if "attention_mask" in batch else batch["input_ids"].numel()
            sync = micro == t.grad_accum_steps - 1
            with accelerator.no_sync(model) if not sync and world > 1 else contextlib.nullcontext():
                with accelerator.autocast():
                    loss = model(**batch, use_cache=False).loss / t.grad_accum_steps
                accelerator.backward(loss)
            loss_sum += loss.detach()
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), t.max_grad_norm)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.samples_consumed += t.micro_batch_size * t.grad_accum_steps * world

        if state.step % t.log_every == 0 or state.step == stop_at:
            loss_value = float(accelerator.reduce(loss_sum, "mean"))
            tokens = int(accelerator.reduce(window_tokens, "sum"))
            state.tokens_consumed += tokens
            elapsed = time.perf_counter() - window_start
            tps = tokens / elapsed
            last = {"step": state.step, "loss": round(loss_value, 6), "grad_norm": round(float(grad_norm), 6),
                    "lr": lr, "tokens_per_s": round(tps, 1),
                    "samples_per_s": round(tps / seq_len, 2),
                    "mfu": round(fpt * tps / (peak * world), 4) if peak else None,
                    "tokens": state.tokens_consumed, "max_steps": t.max_steps}
            metrics.write(last)
            window_start = time.perf_counter()
            window_tokens.zero_()
        if t.eval_every and state.step % t.eval_every == 0 and state.step < t.max_steps:
            _eval_line(model, accelerator, val_data, t, state, metrics)
        if state.step % t.save_every == 0 or state.step == stop_at:
            save_checkpoint(accelerator, raw_model, optimizer, scheduler, tokenizer, state, t)

    result: dict[str, Any] = {"step": state.step, "last": last}
    if state.step >= t.max_steps:
        result["eval"] = _eval_line(model, accelerator, val_data, t, state, metrics)
        final = out / "final"
        if accelerator.is_main_process:
            shutil.rmtree(final, ignore_errors=True)
            raw_model.save_pretrained(final, safe_serialization=True)
            tokenizer.save_pretrained(final)
        result["final_model"] = str(final)
    accelerator.wait_for_everyone()
    metrics.write({"event": "end", **{k: v for k, v in result.items() if k != "last"}, "step": state.step})
    metrics.close()
    accelerator.end_training()
    return result


def _eval_line(model, accelerator, val_data, t, state, metrics) -> dict[str, Any] | None:
    loss = evaluate(model, accelerator, val_data, t)
    if loss is None:
        return None
    line = {"step": state.step, "eval_loss": round(loss, 6), "eval_ppl": round(math.exp(min(loss, 50)), 4)}
    metrics.write(line)
    return line


def guarded(fn, *args):
    """Run fn; on an exception print one recognisable line naming this rank (read by moai.launch), then re-raise."""
    rank = os.environ.get("RANK", "0")
    try:
        return fn(*args)
    except Exception as err:
        print(f"[rank {rank}] moai.train failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moai.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="RESOLVED.json written by moai.launch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s [rank {os.environ.get('RANK', '0')}] %(levelname)s %(name)s: %(message)s")
    guarded(train, json.loads(Path(args.config).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
