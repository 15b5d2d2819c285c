"""Training on prepared data: `accelerate launch` with the resume decision made first, and a failure
that a damaged store can cause named with the check that finds it."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moai.config import PipelineConfig, read_env
from moai.hardware import Plan, detect, plan as make_plan

log = logging.getLogger(__name__)


def launch_training(
    config: PipelineConfig,
    prepared: dict[str, Any],
    on_line: Callable[[str], None],
    on_metrics: Callable[[dict], None] | None = None,
    plan: Plan | None = None,
) -> dict[str, Any]:
    """Train on prepared data with `accelerate launch python -m moai.train`; return the last metrics.

    First `resume_plan` with everything known now (the GPUs, the prepared samples): a checkpoint
    made with other settings is a `ConfigError` before launch, and a finished run is not launched
    again (its last metrics are returned, with "status": "finished"). The whole output of the
    launch goes to `<output_dir>/logs/train-<time>.log`, named by a failure's one-line message."""
    from moai import launch
    from moai.errors import DataError
    from moai.train.checkpoint import resume_plan
    from moai.train.data import num_train_samples, sample_order_identity
    from moai.train.resolved import DataPaths

    t = config.train
    if t is None:
        raise DataError("no train section in the config: nothing to train")
    plan = plan or make_plan(detect(config.cache_dir, with_gpus=True), config, read_env())
    data = DataPaths.model_validate({k: prepared[k] for k in ("sample_index", "tokenizer", "token_store")})
    num_gpus = len(plan.hardware.gpus)
    decided = resume_plan(
        config,
        num_gpus=num_gpus,
        num_samples=num_train_samples(data, config.pack.seq_len),
        sample_order=sample_order_identity(data.sample_index),
    )
    log.info("train: %s", decided.detail)
    if decided.status == "finished":
        metrics = Path(t.output_dir) / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        return {**launch.last_metrics(lines), "status": "finished", "step": decided.step}
    resolved = launch.resolve(config, data, plan.loader_workers.value)
    cmd = launch.launch_command(
        t,
        str(resolved),
        num_gpus=num_gpus,
        port=launch.free_port(),
        accelerate_config=str(resolved.parent / "accelerate.yaml"),
    )
    log_file = launch.log_path(resolved.parent, t.machine_rank, t.num_machines)
    log.info("launching %d training process(es): %s", cmd.num_processes, " ".join(cmd.argv))
    log.info("the whole training output goes to %s", log_file)
    try:
        return launch.run_launch(cmd, on_line, on_metrics, log_file=log_file)
    except launch.TrainingFailed as err:  # the same error (its tail and log path), with the hint
        err.args = (with_damaged_data_hint(str(err), config.cache_dir, [data.sample_index, data.token_store]),)
        raise


# What a token store or sample index changed after it was published makes training fail with: ids
# past the embedding, windows past the tokens, rows of the wrong shape.
# (Not "must match the size of tensor": a model config with other head counts fails with it too.)
DAMAGED_DATA = re.compile(r"IndexError|index out of range|out of bounds|shape mismatch|device-side assert")


def with_damaged_data_hint(message: str, cache_dir: str, folders: list[str | None]) -> str:
    """A training failure's line; for one a damaged store can cause, with the folders it read and the
    check, before the log file (which stays last)."""
    if not DAMAGED_DATA.search(message):
        return message
    where = ", ".join(f for f in folders if f)
    hint = (
        f"if the data it read ({where}) was changed after it was built, `moai cache verify {cache_dir}` "
        "names the damaged folder (remove it and rerun to rebuild it)"
    )
    head, sep, log_file = message.rpartition("; full log: ")
    return f"{head}; {hint}{sep}{log_file}" if sep else f"{message}; {hint}"
