"""Checkpoints: save everything an exact resume needs, find the newest, load it back.

Layout under `<output_dir>/checkpoints/step-<8 digits>/`: `model/` (save_pretrained, safetensors,
with the tokenizer), `optimizer.pt`, `scheduler.pt`, `rng-<rank>.pt` (torch, numpy, python and
CUDA RNG states of each rank) and `state.json` (`TrainState`). A checkpoint is written under
`.tmp-step-…` and renamed once whole, so a kill never leaves a half one under a `step-` name;
the last `keep_last` are kept. The finished model goes to `<output_dir>/final/`.

Costs: a save writes the weights and twice their size in optimizer state, from the main process,
and waits for every rank three times; a load reads them back on every rank.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moai.config import ConfigError, TrainConfig

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    step: int = 0
    samples_consumed: int = 0
    tokens_consumed: int = 0
    # What the order of samples depends on: a resumed run must match, or it would not be exact.
    run: dict[str, Any] | None = None


def run_identity(t: TrainConfig, world: int, seq_len: int, num_samples: int) -> dict[str, Any]:
    return {
        "seed": t.seed,
        "micro_batch_size": t.micro_batch_size,
        "grad_accum_steps": t.grad_accum_steps,
        "world_size": world,
        "seq_len": seq_len,
        "train_samples": num_samples,
        "max_steps": t.max_steps,
    }


def checkpoints(output_dir: Path) -> list[Path]:
    """The whole checkpoints in `output_dir`, oldest first."""
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(
        (p for p in root.iterdir() if p.name.startswith("step-") and (p / "state.json").is_file()),
        key=lambda p: int(p.name.split("-")[1]),
    )


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
    torch.save(
        {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        },
        tmp / f"rng-{accelerator.process_index}.pt",
    )
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
        raise ConfigError(
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
        raise ConfigError(
            f"checkpoint {path} does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}; "
            "restore the train.model_config it was saved with, or give train.output_dir a new folder"
        )
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


def resume(
    output_dir: Path, accelerator, unwrapped, optimizer, scheduler, identity: dict[str, Any]
) -> tuple[TrainState, bool]:
    """The state to start from: the newest checkpoint's, loaded into the model, optimizer,
    scheduler and RNGs (True), or a fresh one (False)."""
    found = checkpoints(output_dir)
    if not found:
        return TrainState(run=identity), False
    state = load_checkpoint(found[-1], accelerator, unwrapped, optimizer, scheduler, identity)
    state.run = identity  # a checkpoint written before `run` was recorded gets it from now on
    log.info("resumed from %s at step %d", found[-1], state.step)
    return state, True


def save_final(accelerator, model, tokenizer, output_dir: Path) -> Path:
    """Save the trained model and its tokenizer to `<output_dir>/final` (main process only)."""
    final = output_dir / "final"
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        model.save_pretrained(final, safe_serialization=True)
        tokenizer.save_pretrained(final)
    return final
