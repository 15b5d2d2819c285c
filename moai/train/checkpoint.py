"""Checkpoints: save everything an exact resume needs, find the newest, load it back.

Layout under `<output_dir>/checkpoints/step-<8 digits>/`: `model/` (save_pretrained, safetensors,
with the tokenizer), `optimizer.pt`, `scheduler.pt`, `rng-<rank>.pt` (torch, numpy, python and
CUDA RNG states of each rank) and `state.json` (`TrainState`). A checkpoint is written under
`.tmp-step-…` and renamed once whole, so a kill never leaves a half one under a `step-` name;
the last `keep_last` are kept. The finished model goes to `<output_dir>/final/`, also published by
rename, so a `final/` folder is a whole one.

`resume_plan` decides, before any data is prepared or process launched, what a run with this
config will do in its output_dir: start fresh, resume from the newest checkpoint, or nothing (it
is finished); a checkpoint made with other settings is a `ConfigError` then, not after launch. It
reads one small `state.json`.

Costs: a save writes the weights and twice their size in optimizer state, from the main process,
and waits for every rank three times; a load reads them back on every rank.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from moai.config import ConfigError, PipelineConfig, TrainConfig
from moai.errors import CacheError

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    step: int = 0
    samples_consumed: int = 0
    tokens_consumed: int = 0
    # What the order of samples depends on: a resumed run must match, or it would not be exact.
    run: dict[str, Any] | None = None


def run_identity(
    t: TrainConfig, world: int | None, seq_len: int, num_samples: int | None, sample_order: str | None = None
) -> dict[str, Any]:
    """What the order of samples and the learning rate depend on; None: not known yet (not compared).
    `sample_order` is `data.sample_order_identity`: "shuffle", or a mixed index's stored order.

    Not the world size, nor how the global batch is split into micro-batches and accumulation:
    sample position p of step s is s x global_batch + p whatever the split (`data.sample_ids`), so
    a run resumes on another number of processes or machines, or with another micro_batch_size x
    grad_accum_steps, as long as their product with the ranks, the global batch, is unchanged."""
    return {
        "seed": t.seed,
        "global_batch": None if world is None else t.micro_batch_size * t.grad_accum_steps * world,
        "seq_len": seq_len,
        "train_samples": num_samples,
        "max_steps": t.max_steps,
        "sample_order": sample_order,
    }


# What a checkpoint written before an entry existed had: every run was shuffled by the trainer.
IDENTITY_DEFAULTS: dict[str, Any] = {"sample_order": "shuffle"}

# Where each entry of a run identity comes from, as a user would change it.
IDENTITY_SETTINGS = {
    "seed": "train.seed",
    "global_batch": "global batch (samples per optimizer step: train.micro_batch_size x train.grad_accum_steps x "
    "ranks, ranks being train.num_processes x train.num_machines or one per GPU)",
    "seq_len": "pack.seq_len",
    "train_samples": "training samples (the prepared data)",
    "max_steps": "train.max_steps (the learning-rate schedule)",
    "sample_order": "sample order (train.seed's shuffle, or a mixed index's stored order: its sources and weights)",
}


def with_global_batch(saved: dict[str, Any]) -> dict[str, Any]:
    """A run identity written before "global_batch" was (it had the split: micro-batch, accumulation
    and world size) gets it from them."""
    mb, accum, world = (saved.get(k) for k in ("micro_batch_size", "grad_accum_steps", "world_size"))
    if "global_batch" in saved or not (isinstance(mb, int) and isinstance(accum, int) and isinstance(world, int)):
        return saved
    return {**saved, "global_batch": mb * accum * world}


def identity_mismatch(output_dir: Path, saved: dict[str, Any], now: dict[str, Any]) -> ConfigError | None:
    """The one-line error for a checkpoint whose run identity differs from this run's (entries of
    `now` that are None are not known yet and not compared); None when they agree."""
    saved = with_global_batch(saved)
    was = {k: saved.get(k, IDENTITY_DEFAULTS.get(k)) for k in now}
    diff = {k: (was[k], v) for k, v in now.items() if v is not None and was[k] != v}
    if not diff:
        return None
    what = ", ".join(
        f"{IDENTITY_SETTINGS.get(k, k)} {old} in the checkpoint, {new} now" for k, (old, new) in diff.items()
    )
    return ConfigError(
        f"train.output_dir {output_dir} holds checkpoints of a run with other settings: {what}; an exact resume "
        f"needs the same ones: restore them, give train.output_dir another folder, or remove this one "
        f"(rm -rf {shlex.quote(str(output_dir))}) to start over"
    )


@dataclass(frozen=True)
class ResumePlan:
    """What a run will do in its output_dir: start at step 0, resume from a checkpoint, or nothing."""

    status: Literal["fresh", "resume", "finished"]
    step: int  # the newest checkpoint's step; 0 when fresh
    detail: str  # one line saying so, for the terminal and `moai plan`


def resume_plan(
    config: PipelineConfig,
    *,
    num_gpus: int | None = None,
    num_samples: int | None = None,
    sample_order: str | None = None,
) -> ResumePlan:
    """Decide from the config and the newest checkpoint's `state.json` (nothing else is read) what
    training will do in train.output_dir; raise `ConfigError` when that checkpoint was made with
    other settings. What is not known yet is not compared: the world size needs train.num_processes
    or `num_gpus`, the number of training samples and their order need the prepared data
    (`num_samples`, `sample_order` from `data.sample_order_identity`), so `launch_training` asks
    again right before launching; the ranks compare everything again when they load it."""
    t = config.train
    if t is None:
        raise ConfigError("the config has no train section: nothing to train (add one, or run moai prepare)")
    out = Path(t.output_dir)
    found = checkpoints(out)
    if not found:
        return ResumePlan("fresh", 0, f"no checkpoint in {out}: training starts at step 0")
    newest = found[-1]
    try:
        state = TrainState(**json.loads((newest / "state.json").read_text()))
    except (OSError, ValueError, TypeError) as err:
        raise CacheError.damaged(newest, f"state.json cannot be read ({err})", "checkpoint") from None
    if state.run is not None:
        world = None
        if t.num_processes is not None or num_gpus is not None:
            world = (t.num_processes or max(1, num_gpus or 0)) * t.num_machines
        now = run_identity(t, world, config.pack.seq_len, num_samples, sample_order)
        if (mismatch := identity_mismatch(out, state.run, now)) is not None:
            raise mismatch
    final = out / "final"
    if state.step >= t.max_steps and final.is_dir():
        return ResumePlan(
            "finished",
            state.step,
            f"already at max_steps {t.max_steps} in {out}; to train further, continue from its final model in a "
            f"new train.output_dir (train.mode: continue, train.init_from: {final})",
        )
    if state.step >= t.max_steps:
        return ResumePlan("resume", state.step, f"{newest} is at max_steps {t.max_steps}: final eval and model to do")
    return ResumePlan("resume", state.step, f"resuming from {newest} (step {state.step} of {t.max_steps})")


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
    if state.run is not None and (mismatch := identity_mismatch(path.parent.parent, state.run, expected)) is not None:
        raise mismatch
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
    """Save the trained model and its tokenizer to `<output_dir>/final` (main process only),
    written under `.tmp-final` and renamed once whole: `resume_plan` takes `final/` for a finished run."""
    final, tmp = output_dir / "final", output_dir / ".tmp-final"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    return final
