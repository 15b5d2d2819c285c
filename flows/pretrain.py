"""The `pretrain` Prefect flow: the stage graph of `moai.pipeline`, then training.

The flow body is the library's graph walk (`pipeline.walk`) with one generic Prefect task per
stage run (`stage_task`, shown under the stage's name). Its Prefect cache key is the library's
store key (`StageKeyPolicy` asks `pipeline.key_of`) plus the cache folder, so Prefect's cache and
the disk agree: a rerun with the same inputs shows the data stages as Cached. When the published
folder of a key has gone (someone cleaned the cache), the task runs with `refresh_cache` and
rebuilds instead of returning a path that no longer exists. What the UI shows is in
`flows/artifacts.py`.

    python flows/pretrain.py            # the embedded `tiny` preset
    python flows/pretrain.py CONFIG     # a YAML/JSON config file, or a preset name
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task, unmapped
from prefect.cache_policies import CachePolicy

if not __package__:  # run as a script (python flows/pretrain.py) or loaded by path (Prefect deployments)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows import artifacts
from flows.training_view import SpikesCard, TrainingView
from moai import pipeline, preflight
from moai.config import PipelineConfig, read_env
from moai.hardware import Plan, detect, plan as make_plan
from moai.pipeline import Inputs, StageResult, launch_training, summary
from moai.presets import resolve_config, tiny
from moai.stages.tokenize import reference
from moai.trace import LossSpikes


@dataclass
class StageKeyPolicy(CachePolicy):
    """A stage task's cache key: the library's key of that stage output, and which cache folder."""

    def compute_key(self, task_ctx, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any) -> str:
        config: PipelineConfig = inputs["config"]
        where = hashlib.sha256(str(Path(config.cache_dir).resolve()).encode()).hexdigest()[:12]
        return f"moai-{inputs['name']}-{pipeline.key_of(config, inputs['name'], inputs['inputs'])}-{where}"


@task(name="fingerprint")
def fingerprint_task(config: PipelineConfig) -> dict[str, str]:
    """The content fingerprints the keys start from (reads every source file once)."""
    return pipeline.roots(config)


@task(name="stage", cache_policy=StageKeyPolicy(), persist_result=True)
def stage_task(
    config: PipelineConfig, name: str, inputs: Inputs, plan: Plan, options: dict[str, Any] | None = None
) -> StageResult:
    """Any stage of the graph: reuse its published output or build it (`pipeline.run_stage`)."""
    progress = artifacts.Progress(artifacts.artifact_key(f"{name}-progress"), f"{name}: done (%)")
    return pipeline.run_stage(config, name, inputs, plan=plan, progress=False, on_progress=progress, options=options)


@task(name="unit")
def unit_task(config: PipelineConfig, stage: str, key: str, inputs: Inputs, index: int, num: int) -> dict:
    return pipeline.UNIT_STAGES[stage].run_unit(config, key, inputs, shard_index=index, num_shards=num)


@flow(name="stage-units")
def stage_units(config: PipelineConfig, name: str, inputs: Inputs, num: int) -> list[dict]:
    """The units of node `name` (`tokenize`, `signatures`, or `tokenize[ko]` of one source) mapped
    over the flow's task runner (Dask or Ray when configured)."""
    key = pipeline.key_of(config, name, inputs)
    cfg, stage_inputs = pipeline.stage_inputs(config, name, inputs)
    stage = pipeline.split_name(name)[0]
    futures = unit_task.with_options(name=f"{stage}-unit").map(
        unmapped(cfg), unmapped(stage), unmapped(key), unmapped(stage_inputs), list(range(num)), unmapped(num)
    )
    return [f.result() for f in futures]


def dask_runner(config: PipelineConfig, plan: Plan):
    """A DaskTaskRunner on the configured scheduler, or on a LocalCluster bound to loopback."""
    from prefect_dask import DaskTaskRunner

    r = config.runner
    if r.address:
        return DaskTaskRunner(address=r.address)
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": unit_workers(config, plan),
            "threads_per_worker": 1,
            "processes": True,
            "host": "127.0.0.1",
            "dashboard_address": None,
        }
    )


def ray_runner(config: PipelineConfig, plan: Plan):
    """A RayTaskRunner connected to the configured cluster (`auto`, `ray://head:10001`), or on a
    local Ray with one CPU per unit worker (dashboard off), shut down after the units."""
    # Ray's usage statistics report: off unless the user turned it on (set to 1)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from prefect_ray import RayTaskRunner

    address = config.runner.address
    if address:
        # "auto" in init_kwargs too: prefect-ray calls ray.init() without it, which starts a local
        # Ray when no cluster is found instead of failing
        return RayTaskRunner(address=address, init_kwargs={"address": "auto"} if address == "auto" else None)
    return RayTaskRunner(
        init_kwargs={"address": "local", "num_cpus": unit_workers(config, plan), "include_dashboard": False}
    )


@contextlib.contextmanager
def ray_on_loopback():
    """While it is open, a local Ray that starts listens on 127.0.0.1 only. On Linux Ray resolves a
    node address of 127.0.0.1 to the machine's outward address and listens on every interface;
    its single-machine mode (the one it uses on macOS and Windows) keeps the node on loopback.
    That mode is read from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when `ray` is imported and by the
    processes `ray.init` starts, so both are set here and put back after."""
    from ray._private import ray_constants

    var = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    before, cluster = os.environ.get(var), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[var], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster
        if before is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = before


@contextlib.contextmanager
def unit_runner(config: PipelineConfig, plan: Plan):
    """The task runner the unit subflows map on (runner.kind dask or ray)."""
    if config.runner.kind == "dask":
        yield dask_runner(config, plan)
    elif config.runner.address:
        yield ray_runner(config, plan)
    else:
        with ray_on_loopback():
            yield ray_runner(config, plan)


def unit_workers(config: PipelineConfig, plan: Plan) -> int:
    """Workers of a local Dask or Ray cluster: runner.n_workers, or one per 2 cores."""
    return config.runner.n_workers or max(1, plan.hardware.cores // 2)


@task(name="train")
def train_task(config: PipelineConfig, prepared: dict[str, Any]) -> dict[str, Any]:
    """accelerate launch the training (not when its output_dir is at max_steps already); the run's
    training card, progress bar and logs follow it live (`flows/training_view.py`)."""
    t = config.train
    assert t is not None  # the flow runs this task only for a config with a train section
    log = get_run_logger()
    view = TrainingView(str(Path(t.output_dir).resolve()), t.max_steps, log=log.info)
    spikes = SpikesCard(LossSpikes(config, prepared), log=log.info, warn=log.warning)

    def on_metrics(record: dict[str, Any]) -> None:
        view.on_metrics(record)
        spikes.on_metrics(record)

    last = launch_training(config, prepared, on_line=view.on_line, on_metrics=on_metrics)
    view.finish(last)
    spikes.finish(last)
    return last


@contextlib.contextmanager
def moai_logs_to_run():
    """Send the `moai` library's log records to this run's logs while the flow runs
    (what PREFECT_LOGGING_EXTRA_LOGGERS does, without touching the process's settings)."""
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger("moai")
    handler = APILogHandler()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# The flow's default parameter (what a deployment shows): built once, when this module loads.
TINY = tiny()


@flow(name="pretrain", log_prints=True)
def pretrain(config: PipelineConfig = TINY) -> dict[str, Any]:
    """Prepare the data of `config`, then train on it when the config has a train section."""
    with moai_logs_to_run():
        return _pretrain(config)


def _pretrain(config: PipelineConfig) -> dict[str, Any]:
    log = get_run_logger()
    preflight.require(config)  # mistakes decidable from the config: one error before any stage runs
    plan = make_plan(detect(config.cache_dir), config, read_env())
    artifacts.publish_plan(plan)
    overview = artifacts.LiveMarkdown("overview", "the data stages in pipeline order, then each stage's detail")
    done: dict[str, StageResult] = {}

    def run(name: str, inputs: Inputs) -> StageResult:
        fresh = not pipeline.is_published(config, name, inputs)
        if fresh:
            building()
        options = None
        stage = pipeline.split_name(name)[0]
        if stage in pipeline.UNIT_STAGES and fresh and config.runner.kind != "local":
            num = config.runner.num_shards or 4 * unit_workers(config, plan)
            with unit_runner(config, plan) as runner:
                units = stage_units.with_options(task_runner=runner)(config, name, inputs, num)
            log.info(
                "%s units: %d parts built, %d reused",
                stage,
                sum(u["built"] for u in units),
                sum(u["skipped"] for u in units),
            )
            options = {"num_shards": num}
        state = stage_task.with_options(name=name, refresh_cache=fresh)(
            config, name, inputs, plan, options, return_state=True
        )
        result: StageResult = state.result()
        if state.name == "Cached":  # Prefect returned the result of the run that built it
            result = dataclasses.replace(result, built=False)
            log.info("%s: reused %s (Prefect cache)", name, result.path)
        done[name] = result
        overview(artifacts.overview_markdown(done, config, plan))
        return result

    # From the first stage to build, transformers loads the given tokenizer meanwhile, in its own process
    with reference.prefetch_when_building(config, plan) as building:
        results = pipeline.walk(config, run, root_values=fingerprint_task(config))
    out = summary(results)
    if config.train is not None and config.train.enabled:
        out["train"] = train_task(config, out)
    return out


if __name__ == "__main__":
    # Without PREFECT_API_URL, Prefect starts a temporary server for this run; offline, its telemetry
    # logs an error on every run. A user who wants it on sets the variable.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    cfg = resolve_config(sys.argv[1]) if len(sys.argv) > 1 else tiny()
    print(json.dumps(pretrain(cfg)))
