"""The training process: build from a `ResolvedRun`, run the optimizer steps, finish.

`train` reads like torchtitan's main: set up Accelerate, build (tokenizer, data, model,
optimizer), resume, run the steps, finish; each is a named function here or in the sibling
modules. Speed: bf16 autocast on GPU, TF32, SDPA or flex_attention, optional torch.compile (with
flex_attention's kernels timed at compile, `tune_flex_attention`), lm_head and loss fused on CUDA
(`moai.train.loss`: no tokens x vocab logits), no host sync per step, fused AdamW on CUDA,
gradient accumulation (no gradient sync but on the last micro-step), gradient clipping. Costs
per step: grad_accum_steps forward and backward passes, one gradient all-reduce and one scalar
all-reduce (the global batch's label count, see `optimizer_step`); a log line adds two scalar
all-reduces, an eval `eval_batches` forward passes, a checkpoint the writes described
in `checkpoint`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moai.config import TrainConfig
from moai.train.checkpoint import TrainState, resume, run_identity, save_checkpoint, save_final
from moai.train.data import (
    Dataset,
    PackedDataset,
    SourceTokens,
    make_loader,
    open_data,
    record_first_samples,
    sample_order_identity,
    source_tokens,
)
from moai.train.machines import Heartbeat, Topology, require_shared_output_dir
from moai.train.metrics import MetricsWriter, Throughput, eval_line
from moai.train.model import attention_kind, build_model, build_optimizer, flops_per_token, peak_flops
from moai.train.resolved import ResolvedRun
from moai.train.tracking import flat_params, open_tracker, require as require_tracker

log = logging.getLogger(__name__)


@dataclass
class Run:
    """The pieces one training process built, shared by the steps, evaluation and checkpoints."""

    t: TrainConfig
    out: Path
    accelerator: Any
    tokenizer: Any
    val_data: Dataset
    model: Any  # what forward and backward use: prepared for the processes, maybe compiled
    raw_model: Any  # the plain module: what checkpoints save (no DDP or compile prefix in the names)
    optimizer: Any
    scheduler: Any
    state: TrainState
    metrics: MetricsWriter
    seq_len: int
    token_flops: float  # training FLOPs per token (`flops_per_token`), for MFU
    peak: float | None  # this GPU's bf16 peak FLOP/s, for MFU; None: unknown (or no GPU)
    sources: SourceTokens | None = None  # tokens read per source (a mixed index); None: one source


def train(job: ResolvedRun) -> dict[str, Any]:
    """Train as `job` says, from the newest checkpoint in train.output_dir if there is one; return
    the end of the run: its step, its last log line and, once max_steps is reached, the final eval
    and where the final model is. Over several machines, the output_dir must be one they share, and
    a lost machine ends the run with a line naming it (`moai.train.machines`)."""
    t, out = job.train, Path(job.train.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    accelerator, mixed = start_accelerator(t, out)
    if t.num_machines == 1:
        return train_on(job, accelerator, mixed)
    top = Topology.from_env(t.num_machines)
    require_shared_output_dir(accelerator, out, top)
    heartbeat = Heartbeat(top)
    with heartbeat.watching():
        result = train_on(job, accelerator, mixed)
    heartbeat.finish()
    return result


def train_on(job: ResolvedRun, accelerator, mixed: str) -> dict[str, Any]:
    """`train` once the processes are up: build, resume, run the steps, finish."""
    import torch
    from accelerate.utils import set_seed
    from transformers import AutoTokenizer

    t, out = job.train, Path(job.train.output_dir)
    set_seed(t.seed)  # same initial weights on every rank

    tokenizer = AutoTokenizer.from_pretrained(job.data.tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    train_data = open_data(job.data, "train", job.config.pack.seq_len, pad_id)
    val_data = open_data(job.data, "validation", job.config.pack.seq_len, pad_id)
    seq_len = train_data.seq_len
    attn = attention_kind(t, torch.cuda.is_available(), isinstance(train_data, PackedDataset))
    model = build_model(t, len(tokenizer), tokenizer, attn)
    if torch.cuda.is_available():
        from moai.train.loss import fuse_lm_loss

        fuse_lm_loss(model)  # the loss without the tokens x vocab logits (moai.train.loss)
    num_params = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(model.config, num_params, seq_len)
    optimizer, scheduler = build_optimizer(model, t)
    model, optimizer = accelerator.prepare(model, optimizer)
    raw_model = accelerator.unwrap_model(model)

    world, rank = accelerator.num_processes, accelerator.process_index
    identity = run_identity(t, world, seq_len, len(train_data), sample_order_identity(train_data))
    state, resumed = resume(out, accelerator, raw_model, optimizer, scheduler, identity)
    tracker, logged_through = None, 0
    if t.tracker != "none" and accelerator.is_main_process:
        params = flat_params(job.config.model_dump(mode="json", by_alias=True))
        tracker, logged_through = open_tracker(t.tracker, out, params, t.tracker_project, resuming=resumed)
    metrics = MetricsWriter(accelerator, out, state.step, tracker, logged_through)
    if t.compile:
        if attn == "flex_attention" and torch.cuda.is_available():
            tune_flex_attention()
        model = torch.compile(model)
    loader = make_loader(train_data, t, rank, world, state.step, job.loader_workers)
    record_first_samples(out, train_data, t, rank, world, state.step)

    device_name = torch.cuda.get_device_name(accelerator.device) if torch.cuda.is_available() else None
    sources = source_tokens(train_data, t, world)
    metrics.write(
        {
            "event": "start",
            "step": state.step,
            "world_size": world,
            # how this launch splits the global batch: `moai trace` names each step's ranks by it
            "micro_batch_size": t.micro_batch_size,
            "grad_accum_steps": t.grad_accum_steps,
            "parameters": num_params,
            "train_samples": len(train_data),
            "seq_len": seq_len,
            "device": device_name or "cpu",
            "mixed_precision": mixed,
            "attention": attn,
            "resumed": resumed,
            **({"tracker_url": tracker.url} if tracker is not None and tracker.url else {}),
            **({"sources": train_data.source_names} if sources else {}),
        }
    )
    run = Run(
        t,
        out,
        accelerator,
        tokenizer,
        val_data,
        model,
        raw_model,
        optimizer,
        scheduler,
        state,
        metrics,
        seq_len,
        fpt,
        peak_flops(device_name),
        sources,
    )
    stop_at = min(t.max_steps, state.step + t.stop_after_steps) if t.stop_after_steps else t.max_steps
    last = run_steps(run, loader, stop_at)
    return finish(run, last)


def tune_flex_attention() -> None:
    """Have inductor time flex_attention's kernel configurations (block sizes, warps, stages) when it
    compiles them, instead of taking its one default per GPU, with the matrix products left on
    cuBLAS (no Triton GEMM search). On one H100 with docs/performance.md's 1.1B Llama (benchmarks/train_mfu.py):
    the forward kernel 1.54 -> 1.07 ms and the backward 3.39 -> 3.05 ms a layer, tokens/s +3.1%; the
    first step of a run on a fresh machine takes about a minute more (91 -> 152 s; the choices are
    cached with the compiled kernels). Not when the user set TORCHINDUCTOR_MAX_AUTOTUNE either way
    (TORCHINDUCTOR_MAX_AUTOTUNE=0: inductor's defaults)."""
    import torch._inductor.config as inductor

    if "TORCHINDUCTOR_MAX_AUTOTUNE" in os.environ:
        return
    inductor.max_autotune = True
    inductor.max_autotune_gemm_backends = "ATEN"


def start_accelerator(t: TrainConfig, out: Path):
    """The Accelerator for this process and its mixed precision; the tracker's package is checked
    here, before any work (the main process opens the tracker, `moai.train.tracking`)."""
    import torch
    from accelerate import Accelerator

    mixed = t.mixed_precision or ("bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no")
    if t.tracker != "none":
        require_tracker(t.tracker)
    accelerator = Accelerator(mixed_precision=mixed, project_dir=str(out))
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return accelerator, mixed


def run_steps(run: Run, loader, stop_at: int) -> dict[str, Any]:
    """Optimizer steps from run.state.step up to `stop_at`, logging, evaluating and saving on
    schedule; return the last log line."""
    t, state = run.t, run.state
    world = run.accelerator.num_processes
    run.model.train()
    window = Throughput(run.accelerator.device)
    batches = iter(loader)
    last: dict[str, Any] = {}
    while state.step < stop_at:
        lr = run.scheduler.get_last_lr()[0]  # the rate this step uses
        loss_sum, grad_norm = optimizer_step(run, batches, window)
        state.step += 1
        state.samples_consumed += t.micro_batch_size * t.grad_accum_steps * world

        if state.step % t.log_every == 0 or state.step == stop_at:
            last = log_step(run, window, loss_sum, grad_norm, lr)
        if t.eval_every and state.step % t.eval_every == 0 and state.step < t.max_steps:
            eval_line(run.model, run.accelerator, run.val_data, t, state.step, run.metrics)
        if state.step % t.save_every == 0 or state.step == stop_at:
            save_checkpoint(run.accelerator, run.raw_model, run.optimizer, run.scheduler, run.tokenizer, state, t)
            run.metrics.commit(state.step)  # the tracker gets the lines this checkpoint covers
    return last


def optimizer_step(run: Run, batches, window: Throughput):
    """One optimizer step over grad_accum_steps micro-batches; return (the loss, the gradient norm
    before clipping), both still on the device.

    The loss is the mean over every label of the global batch, whatever its split into ranks and
    micro-batches: each micro-batch's summed loss is divided by the global batch's label count over
    the ranks (DDP averages gradients over ranks). A step therefore does the same with 2 ranks x 1
    micro-batch as with 1 rank x 2, or 4 micro-batches of 2 samples as 2 of 4, even when rows hold
    different numbers of labels (best_fit padding, chat loss masks); a mean per micro-batch would
    weigh their tokens differently. Cost: the step's micro-batches are read and copied to the
    device before the first forward, and one scalar all-reduce. No host sync: the copies are
    asynchronous (pinned memory) and the labels are counted on the device (a count made on the host
    and copied with torch.tensor(..., device=) waits for the GPU to finish the previous step, and
    the GPU then idles while the host launches the next: on one H100 with docs/performance.md's 1.1B Llama,
    3.4 ms of GPU idle a step, 9.2 -> 5.7 ms, measured by benchmarks/train_mfu.py)."""
    import torch

    t, accelerator, model = run.t, run.accelerator, run.model
    world = accelerator.num_processes
    device_batches = [
        {k: v.to(accelerator.device, non_blocking=True) for k, v in next(batches).items()}
        for _ in range(t.grad_accum_steps)
    ]
    local = sum(label_count(b) for b in device_batches)
    total = accelerator.reduce(local, "sum") if world > 1 else local
    # a global batch with no label at all (chat prompts only): every loss is 0, not 0/0
    per_rank = total.clamp(min=1).to(torch.float32) / world
    loss_sum = torch.zeros((), device=accelerator.device)
    for micro, batch in enumerate(device_batches):
        window.count(batch)
        # Gradients are all-reduced on the last micro-step only: the others accumulate locally.
        sync = micro == t.grad_accum_steps - 1
        with accelerator.no_sync(model) if not sync and world > 1 else contextlib.nullcontext():
            with accelerator.autocast():
                loss = model(**batch, use_cache=False, num_items_in_batch=per_rank).loss
            accelerator.backward(loss)
        loss_sum += loss.detach()
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), t.max_grad_norm)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def label_count(batch: dict[str, Any]):
    """How many labels a micro-batch predicts (labels shift by one: the first of a row is never
    one), as a tensor on the batch's device (no host sync)."""
    return (batch["labels"][:, 1:] != -100).sum()


def log_step(run: Run, window: Throughput, loss_sum, grad_norm, lr: float) -> dict[str, Any]:
    """Write the log line of the step just taken (loss averaged over the ranks, throughput since
    the last line, MFU against the GPU's bf16 peak) and start a new window; collective."""
    t, state, accelerator = run.t, run.state, run.accelerator
    loss_value = float(accelerator.reduce(loss_sum, "mean"))
    tokens, elapsed = window.read(accelerator)
    state.tokens_consumed += tokens
    tps = tokens / elapsed
    peak = run.peak
    line = {
        "step": state.step,
        "loss": round(loss_value, 6),
        "grad_norm": round(float(grad_norm), 6),
        "lr": lr,
        "tokens_per_s": round(tps, 1),
        "samples_per_s": round(tps / run.seq_len, 2),
        "mfu": round(run.token_flops * tps / (peak * accelerator.num_processes), 4) if peak else None,
        "tokens": state.tokens_consumed,
        "max_steps": t.max_steps,
    }
    if run.sources is not None:
        line["tokens_by_source"] = run.sources.upto(state.samples_consumed)
    run.metrics.write(line)
    window.restart()
    return line


def finish(run: Run, last: dict[str, Any]) -> dict[str, Any]:
    """End this invocation: at max_steps, the final eval and model; then the end line; close."""
    t, state, accelerator = run.t, run.state, run.accelerator
    result: dict[str, Any] = {"step": state.step, "last": last}
    if state.step >= t.max_steps:
        result["eval"] = eval_line(run.model, accelerator, run.val_data, t, state.step, run.metrics)
        final = save_final(accelerator, run.raw_model, run.tokenizer, run.out)
        result["final_model"] = str(final)
        run.metrics.artifact(final, "final")
    run.metrics.commit(state.step)
    accelerator.wait_for_everyone()
    run.metrics.write({"event": "end", **{k: v for k, v in result.items() if k != "last"}, "step": state.step})
    run.metrics.close()
    accelerator.end_training()
    return result


def guarded(fn, *args):
    """Run fn; on an exception print one recognisable line naming this rank (read by moai.launch), then re-raise."""
    rank = os.environ.get("RANK", "0")
    try:
        return fn(*args)
    except Exception as err:
        print(f"[rank {rank}] moai.train failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        raise
