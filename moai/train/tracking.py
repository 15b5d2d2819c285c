"""Trackers: TensorBoard, MLflow and Weights & Biases, fed from the run's metrics lines.

Every number a tracker holds is a number of `metrics.jsonl`, at the same step: the step and eval
lines (not the start and end events), their per-source dicts flattened (`tokens_by_source` ->
`tokens/<source>`). A tracker gets a step's lines once the checkpoint of that step is written
(`MetricsWriter.commit`), never before: a run killed after step 27 with its newest checkpoint at
step 20 has given the tracker steps up to 20 only, and the resumed run logs 21-27 once, as
`metrics.jsonl` (which it trims back to step 20) holds them. The price is that the tracker shows
a step `save_every` steps late at most; the live view of a run is stdout, `metrics.jsonl` and the
Prefect run's training card.

`<output_dir>/tracker.json` says which tracker run this output_dir logs to (MLflow run id, W&B
run id, the MLflow run's link) and the last step it was given (`logged_through`). A run resuming
from a checkpoint continues that tracker run, first giving it the lines of `metrics.jsonl` after
`logged_through` (a kill between a checkpoint and its commit, or a tracker switched on mid-run);
a fresh start (no checkpoint) opens a new tracker run. The parameters (the resolved config,
flattened to dotted keys) are logged when a tracker run is opened.

- `tensorboard`: events under `<output_dir>/moai/`;
- `mlflow`: the server `MLFLOW_TRACKING_URI` names (mlflow reads it), experiment
  `train.tracker_project`, run named after the output_dir; the final model folder is uploaded as
  the run's `final/` artifact;
- `wandb`: project `train.tracker_project`, files under `<output_dir>/wandb/`; `WANDB_MODE=offline`
  writes the run there only, and `wandb sync <output_dir>/wandb/offline-run-*` uploads it later.

Costs: one tracker call per committed line (MLflow: one HTTP request per line), on the main process
only, at checkpoint time; a small JSON file rewritten per checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from moai.config import ConfigError

log = logging.getLogger(__name__)

STATE = "tracker.json"
# A record's per-source dicts, as the trackers name their scalars.
GROUPS = {"tokens_by_source": "tokens"}


def tracker_numbers(record: dict[str, Any]) -> dict[str, float]:
    """The scalars a tracker gets for a metrics record: its numbers but the step, and its per-source
    dicts flattened; none for an event (start, end) or a record without a step."""
    if record.get("event") or not isinstance(record.get("step"), int):
        return {}
    numbers = {
        k: v
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None
    }
    for key, prefix in GROUPS.items():  # {"ko": 3} under "tokens_by_source" -> "tokens/ko"
        numbers.update({f"{prefix}/{name}": v for name, v in (record.get(key) or {}).items()})
    return numbers


def flat_params(tree: dict[str, Any], prefix: str = "") -> dict[str, str | int | float | bool]:
    """A nested config as dotted keys (`train.lr`); lists and None as JSON text."""
    flat: dict[str, str | int | float | bool] = {}
    for key, v in tree.items():
        name = f"{prefix}{key}"
        if isinstance(v, dict) and v:
            flat.update(flat_params(v, name + "."))
        elif isinstance(v, (str, int, float, bool)):
            flat[name] = v
        else:
            flat[name] = json.dumps(v)
    return flat


class Tracker:
    """One tracker run. Subclasses open it in `__init__` (a new run, or `resume_id`'s) and log."""

    kind = "none"
    run_id: str | None = None
    url: str | None = None  # an http link to the run, for the Prefect run's artifact

    def log(self, numbers: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def artifact(self, folder: Path, name: str) -> None:
        """Upload a folder (the final model) as the run's artifact `name`, where the tracker keeps files."""

    def close(self) -> None:
        """End the run (finished)."""


class TensorBoard(Tracker):
    kind = "tensorboard"

    def __init__(self, out: Path, params: dict[str, Any], resume_id: str | None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out / "moai"))
        if resume_id is None:
            self.writer.add_text("config", "```\n" + json.dumps(params, indent=1) + "\n```", 0)

    def log(self, numbers: dict[str, float], step: int) -> None:
        for k, v in numbers.items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MLflow(Tracker):
    kind = "mlflow"

    def __init__(self, out: Path, params: dict[str, Any], resume_id: str | None, project: str):
        import mlflow
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        self.client = MlflowClient()
        uri = mlflow.get_tracking_uri()
        if resume_id is None:
            found = self.client.get_experiment_by_name(project)
            experiment = found.experiment_id if found else self.client.create_experiment(project)
            run = self.client.create_run(experiment, run_name=out.name)
            # MLflow keeps a parameter's first value only: the rest of a longer one would be lost unsaid
            items = [Param(k, str(v)) for k, v in params.items() if len(str(v)) <= MAX_PARAM_VAL_LENGTH]
            for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
                self.client.log_batch(run.info.run_id, params=items[i : i + MAX_PARAMS_TAGS_PER_BATCH])
        else:
            run = self.client.get_run(resume_id)
            self.client.update_run(resume_id, status="RUNNING")
        self.run_id = self.mlflow_id = run.info.run_id
        if uri.startswith(("http://", "https://")):
            self.url = f"{uri.rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{self.run_id}"

    def log(self, numbers: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        at = int(time.time() * 1000)
        self.client.log_batch(self.mlflow_id, metrics=[Metric(k, float(v), at, step) for k, v in numbers.items()])

    def artifact(self, folder: Path, name: str) -> None:
        self.client.log_artifacts(self.mlflow_id, str(folder), artifact_path=name)

    def close(self) -> None:
        self.client.set_terminated(self.mlflow_id)


class WandB(Tracker):
    kind = "wandb"

    def __init__(self, out: Path, params: dict[str, Any], resume_id: str | None, project: str):
        import wandb
        from wandb.sdk.lib.runid import generate_id

        # console off: wandb would otherwise wrap stdout, which carries the metrics lines moai.launch reads
        self.run = wandb.init(
            project=project,
            name=out.name,
            id=resume_id or generate_id(),
            resume="allow",
            dir=str(out),
            config=params if resume_id is None else None,
            settings=wandb.Settings(console="off"),
        )
        self.run_id = self.run.id
        self.url = self.run.url  # None offline

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.run.log(numbers, step=step)

    def artifact(self, folder: Path, name: str) -> None:
        import wandb

        art = wandb.Artifact(f"{self.run.id}-{name}", type="model")
        art.add_dir(str(folder))
        self.run.log_artifact(art)

    def close(self) -> None:
        self.run.finish()


TRACKER_MODULES = {"mlflow": "mlflow", "wandb": "wandb", "tensorboard": "tensorboard"}


def tracker_error(kind: str) -> ConfigError | None:
    """The one-line error for a tracker whose library is not installed, else None (found without importing it)."""
    import importlib.util

    module = TRACKER_MODULES.get(kind)
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return ConfigError(
        f"train.tracker {kind} needs the {module} package, not installed here: pip install 'moai[track]' "
        f"(or {module}), or set train.tracker: none"
    )


def require(kind: str) -> None:
    """Raise `tracker_error` when there is one."""
    if (err := tracker_error(kind)) is not None:
        raise err


def read_state(out: Path) -> dict[str, Any]:
    try:
        state = json.loads((out / STATE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def open_tracker(kind: str, out: Path, params: dict[str, Any], project: str, resuming: bool) -> tuple[Tracker, int]:
    """The tracker run for this invocation and the step it was given lines up to: the one
    tracker.json names when `resuming` from a checkpoint with the same tracker, else a new run (0)."""
    require(kind)
    state = read_state(out) if resuming else {}
    same = state.get("kind") == kind
    resume_id = state.get("run_id") if same else None
    tracker: Tracker
    if kind == "tensorboard":
        tracker = TensorBoard(out, params, "events" if same else None)
    elif kind == "mlflow":
        tracker = MLflow(out, params, resume_id, project)
    elif kind == "wandb":
        tracker = WandB(out, params, resume_id, project)
    else:
        raise ValueError(f"unknown tracker {kind}")
    through = int(state.get("logged_through", 0)) if same else 0
    write_state(out, tracker, through)
    if tracker.url:
        log.info("%s run: %s", kind, tracker.url)
    return tracker, through


def write_state(out: Path, tracker: Tracker, logged_through: int) -> None:
    """tracker.json, replaced whole (written beside it, then renamed)."""
    state = {"kind": tracker.kind, "run_id": tracker.run_id, "url": tracker.url, "logged_through": logged_through}
    tmp = out / f".{STATE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, out / STATE)
