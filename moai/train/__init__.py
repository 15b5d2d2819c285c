"""Training on Accelerate: `python -m moai.train --config RESOLVED.json` (what `accelerate launch` runs).

One process per rank runs `loop.train`: set up → build → resume → steps → finish.

- `resolved`: `ResolvedRun`, the typed RESOLVED.json that `moai.launch.resolve` writes and each
  training process reads and validates;
- `data`: the order of samples, a pure function of (seed, epoch, i) sharded by rank, so a resume
  needs only the step count (O(1), no batches replayed): shuffled per epoch, or the stored order
  of a mixed index (format 2); packed samples (memory-mapped, with `position_ids` restarting at
  each document, and `use_cache=False`, so attention stops at document boundaries) or padded
  documents; this rank's loader; tokens read per source of a mixed index (`SourceTokens`);
- `model`: the model, AdamW with a cosine schedule and warm-up, FLOPs per token and GPU peaks (MFU);
- `checkpoint`: every `save_every` steps (model + tokenizer via save_pretrained, optimizer,
  scheduler, RNG states, samples consumed), the last `keep_last` kept, published by rename; a
  rerun with the same output_dir resumes from the newest one, bit-identically; `resume_plan`
  decides fresh / resume / finished (or refuses other settings) before data prep and launch;
- `metrics`: one JSON line per `log_every` steps on stdout and in `<output_dir>/metrics.jsonl`
  (a resumed run first drops the lines after its start step), evaluation on the validation split;
  a mixed run adds "tokens_by_source" to step lines and "eval_loss/<source>" to eval lines;
- `tracking`: TensorBoard, MLflow or W&B, given each metrics line once its checkpoint is written
  (so a resumed run never logs a step twice), the same tracker run across resumes (`tracker.json`);
- `machines`: over several machines, the shared output_dir check before training and the heartbeat
  that names a lost machine;
- `loop`: `train`, its steps, and `guarded` (the one failure line `moai.launch` reads).

Importing this package loads numpy and pydantic, not torch, transformers or accelerate: those are
imported where used, so `moai.launch` and the CLI stay quick to import.
"""

from moai.train.checkpoint import (
    ResumePlan,
    TrainState,
    checkpoints,
    load_checkpoint,
    resume_plan,
    run_identity,
    save_checkpoint,
)
from moai.train.data import (
    DocumentDataset,
    PackedDataset,
    SourceTokens,
    StepBatches,
    epoch_order,
    make_loader,
    open_data,
    sample_ids,
    sample_order_identity,
)
from moai.train.loop import guarded, train
from moai.train.metrics import MetricsWriter, evaluate, evaluate_sources, kept_metrics, trim_metrics
from moai.train.model import (
    PEAK_BF16,
    attention_kind,
    build_model,
    build_optimizer,
    cosine_with_warmup,
    flops_per_token,
    peak_flops,
)
from moai.train.resolved import DataPaths, ResolvedRun

__all__ = [
    "PEAK_BF16",
    "DataPaths",
    "DocumentDataset",
    "MetricsWriter",
    "PackedDataset",
    "ResolvedRun",
    "ResumePlan",
    "SourceTokens",
    "StepBatches",
    "TrainState",
    "attention_kind",
    "build_model",
    "build_optimizer",
    "checkpoints",
    "cosine_with_warmup",
    "epoch_order",
    "evaluate",
    "evaluate_sources",
    "flops_per_token",
    "guarded",
    "kept_metrics",
    "load_checkpoint",
    "make_loader",
    "open_data",
    "peak_flops",
    "resume_plan",
    "run_identity",
    "sample_ids",
    "sample_order_identity",
    "save_checkpoint",
    "train",
    "trim_metrics",
]
