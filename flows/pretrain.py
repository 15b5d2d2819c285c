"""The `pretrain` Prefect flow: convert → filter → save → tokenizer → tokenize → pack → train.

Each task is a thin wrapper around one `moai.pipeline.Pipeline` stage. A task's Prefect cache
key is the stage's store key (plus the cache folder), so Prefect's cache and the disk agree: a
rerun with the same inputs shows the data stages as Cached. Prefect's default policy would
include the run id and never hit across runs, so the key function is set explicitly. When the
published folder of a key has gone (someone cleaned the cache), the task runs with
`refresh_cache` and rebuilds instead of returning a path that no longer exists.

    python flows/pretrain.py            # the embedded `tiny` preset
    python flows/pretrain.py CONFIG     # a YAML/JSON config file, or a preset name
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.context import TaskRunContext

from moai.config import PipelineConfig, read_env, resolve_config
from moai.hardware import detect, plan as make_plan
from moai.pipeline import Pipeline, StageResult, launch_training, summary
from moai.presets import tiny


def stage_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    root = str(Path(parameters["config"].cache_dir).resolve())
    where = hashlib.sha256(root.encode()).hexdigest()[:12]
    return f"moai-{context.task.name}-{parameters['key']}-{where}"


CACHED = {"cache_key_fn": stage_cache_key, "persist_result": True}


def _pipeline(config: PipelineConfig) -> Pipeline:
    return Pipeline(config, progress=False)


def _checked(result: StageResult, key: str) -> StageResult:
    if result.key != key:  # the flow and the library must agree on keys, or caching lies
        raise RuntimeError(f"{result.stage}: flow key {key} != store key {result.key}")
    return result


@task(name="fingerprint")
def fingerprint_task(config: PipelineConfig) -> str:
    return _pipeline(config).source_fingerprint()


@task(name="convert", **CACHED)
def convert_task(config: PipelineConfig, key: str, source_fp: str) -> StageResult:
    return _checked(_pipeline(config).convert(source_fp), key)


@task(name="filter", **CACHED)
def filter_task(config: PipelineConfig, key: str, converted: StageResult) -> StageResult:
    return _checked(_pipeline(config).filter(converted), key)


@task(name="save", **CACHED)
def save_task(config: PipelineConfig, key: str, filtered: StageResult) -> StageResult:
    return _checked(_pipeline(config).save(filtered), key)


@task(name="tokenizer", **CACHED)
def tokenizer_task(config: PipelineConfig, key: str, saved: StageResult) -> StageResult:
    return _checked(_pipeline(config).tokenizer(saved), key)


@task(name="tokenize", **CACHED)
def tokenize_task(config: PipelineConfig, key: str, saved: StageResult, tok: StageResult) -> StageResult:
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    bar = create_progress_artifact(0.0, key="tokenize-progress", description="tokenize: documents done (%)")
    pipe = Pipeline(config, progress=False, on_progress=lambda stage, f: update_progress_artifact(bar, 100.0 * f))
    return _checked(pipe.tokenize(saved, tok), key)


@task(name="tokenize-shard")
def tokenize_shard_task(config: PipelineConfig, saved: StageResult, tok: StageResult, index: int, num: int) -> dict:
    return _pipeline(config).tokenize_shard(saved, tok, index, num)


@task(name="tokenize-merge", **CACHED)
def tokenize_merge_task(config: PipelineConfig, key: str, saved: StageResult, tok: StageResult, num: int) -> StageResult:
    return _checked(_pipeline(config).tokenize_merged(saved, tok, num), key)


@flow(name="tokenize-shards")
def tokenize_shards(config: PipelineConfig, saved: StageResult, tok: StageResult, num: int) -> list[dict]:
    """The tokenize units mapped over the flow's task runner (Dask when configured)."""
    futures = tokenize_shard_task.map(unmapped(config), unmapped(saved), unmapped(tok), list(range(num)), unmapped(num))
    return [f.result() for f in futures]


def dask_runner(config: PipelineConfig):
    """A DaskTaskRunner on the configured scheduler, or on a LocalCluster bound to loopback."""
    from prefect_dask import DaskTaskRunner

    r = config.runner
    if r.address:
        return DaskTaskRunner(address=r.address)
    workers = r.n_workers or max(1, (os.cpu_count() or 2) // 2)
    return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True,
                                          "host": "127.0.0.1", "dashboard_address": None})


@task(name="pack", **CACHED)
def pack_task(config: PipelineConfig, key: str, tokens: StageResult) -> StageResult:
    return _checked(_pipeline(config).pack(tokens), key)


@task(name="train")
def train_task(config: PipelineConfig, prepared: dict[str, Any]) -> dict[str, Any]:
    """accelerate launch the training; every output line goes to this run's logs."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    log = get_run_logger()
    t = config.train
    progress = create_progress_artifact(0.0, key="train-progress", description=f"training steps done of {t.max_steps}")

    def on_metrics(record: dict) -> None:
        if "loss" in record:
            update_progress_artifact(progress, 100.0 * record["step"] / t.max_steps)

    last = launch_training(config, prepared, on_line=log.info, on_metrics=on_metrics)
    update_progress_artifact(progress, 100.0)
    shown = ("step", "loss", "eval_loss", "eval_ppl", "tokens_per_s", "mfu", "grad_norm", "lr", "final_model")
    create_table_artifact([{"metric": k, "value": str(last.get(k))} for k in shown],
                          key="train-summary", description=f"training: {t.output_dir}")
    create_markdown_artifact(loss_curve_markdown(Path(t.output_dir) / "metrics.jsonl"), key="train-loss-curve")
    return last


def loss_curve_markdown(metrics_file: Path, width: int = 60, height: int = 12) -> str:
    """The loss curve as a text chart plus a table, for a markdown artifact."""
    points = [(r["step"], r["loss"]) for r in map(json.loads, metrics_file.read_text().splitlines()) if "loss" in r]
    if not points:
        return "# Loss curve\n\nno loss lines yet"
    steps, losses = zip(*points)
    lo, hi = min(losses), max(losses)
    grid = [[" "] * width for _ in range(height)]
    for s, v in points:
        x = round((s - steps[0]) / max(1, steps[-1] - steps[0]) * (width - 1))
        y = round((hi - v) / ((hi - lo) or 1) * (height - 1))
        grid[y][x] = "•"
    chart = "\n".join(f"{hi - (hi - lo) * i / (height - 1):8.3f} │{''.join(row)}" for i, row in enumerate(grid))
    chart += f"\n{'':8} └{'─' * width}\n{'':10}step {steps[0]} … {steps[-1]}"
    table = "| step | loss |\n|---:|---:|\n" + "\n".join(f"| {s} | {v:.4f} |" for s, v in points)
    return f"# Loss curve\n\n```\n{chart}\n```\n\n{table}\n"


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


def _report_artifacts(result: StageResult) -> None:
    """A table of the stage's report and a link to its output folder."""
    flat = {k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in result.report.items()
            if k not in ("splits",)}
    rows = [{"field": k, "value": str(v)} for k, v in flat.items()]
    rows += [{"field": "output", "value": result.path}, {"field": "built now", "value": str(result.built)}]
    create_table_artifact(rows, key=f"stage-{result.stage}", description=f"{result.stage} report: {result.path}")
    create_link_artifact(Path(result.path).as_uri(), link_text=result.path, key=f"stage-{result.stage}-output",
                         description=f"{result.stage} output folder")


def packing_markdown(pack: StageResult) -> str:
    """Document-length histogram and packing efficiency of the train split, as markdown."""
    train = pack.report["splits"]["train"]
    most = max((b["documents"] for b in train["length_histogram"]), default=1) or 1
    rows = "\n".join(
        f"| {b['from']}–{b['to'] if b['to'] is not None else '∞'} | {b['documents']:,} | {'█' * round(30 * b['documents'] / most)} |"
        for b in train["length_histogram"] if b["documents"])
    return (
        f"# Packing (train split)\n\n- samples: {train['samples']:,} × {pack.report['seq_len']} tokens\n"
        f"- tokens used: {train['tokens_used']:,} of {train['tokens']:,} ({100 * train['fraction_used']:.2f}%),"
        f" padding: 0\n- documents split across samples: {train['documents_split']:,} of {train['documents']:,}\n"
        f"- mean document length: {train['mean_document_tokens']} tokens\n\n"
        f"## Document lengths (tokens)\n\n| length | documents | |\n|---|---:|---|\n{rows}\n"
    )


@flow(name="pretrain", log_prints=True)
def pretrain(config: PipelineConfig = tiny()) -> dict[str, Any]:
    """Prepare the data of `config`, then train on it when the config has a train section."""
    with moai_logs_to_run():
        return _pretrain(config)


def _pretrain(config: PipelineConfig) -> dict[str, Any]:
    log = get_run_logger()
    plan = make_plan(detect(config.cache_dir), config, read_env())
    create_table_artifact(plan.rows(), key="hardware-plan", description=f"Hardware plan: {plan.hardware}")
    pipe = Pipeline(config, plan=plan)

    def run(task_fn, stage: str, key: str, *args) -> StageResult:
        fresh = not pipe.is_published(stage, key)
        result = task_fn.with_options(refresh_cache=fresh)(config, key, *args)
        log.info("%s: %s", stage, result.path)
        _report_artifacts(result)
        return result

    results: dict[str, StageResult] = {}
    source_fp = fingerprint_task(config)
    results["convert"] = run(convert_task, "convert", pipe.key("convert", source_fp), source_fp)
    results["filter"] = run(filter_task, "filter", pipe.key("filter", results["convert"].key), results["convert"])
    results["save"] = run(save_task, "save", pipe.key("save", results["filter"].key), results["filter"])
    tok_key = pipe.tokenizer_key(results["save"].key)
    results["tokenizer"] = run(tokenizer_task, "tokenizer", tok_key, results["save"])
    tokenize_key = pipe.key("tokenize", results["save"].key, tok_key)
    if config.runner.kind == "dask" and not pipe.is_published("tokenize", tokenize_key):
        num = config.runner.num_shards or 4 * (config.runner.n_workers or max(1, (os.cpu_count() or 2) // 2))
        units = tokenize_shards.with_options(task_runner=dask_runner(config))(
            config, results["save"], results["tokenizer"], num)
        log.info("tokenize units: %d parts built, %d reused", sum(u["built"] for u in units),
                 sum(u["skipped"] for u in units))
        results["tokenize"] = run(tokenize_merge_task, "tokenize", tokenize_key, results["save"], results["tokenizer"],
                                  num)
    else:
        results["tokenize"] = run(tokenize_task, "tokenize", tokenize_key, results["save"], results["tokenizer"])
    if config.pack.enabled:
        results["pack"] = run(pack_task, "pack", pipe.key("pack", results["tokenize"].key), results["tokenize"])
        create_markdown_artifact(packing_markdown(results["pack"]), key="packing")
    out = summary(results)
    if config.train is not None and config.train.enabled:
        out["train"] = train_task(config, out)
    create_markdown_artifact(
        f"# moai data\n\n- token store: `{out['token_store']}`\n- sample index: `{out['sample_index']}`\n"
        f"- documents: {out['num_documents']:,}\n- tokens: {out['num_tokens']:,}\n",
        key="pretrain-summary",
    )
    return out


if __name__ == "__main__":
    cfg = resolve_config(sys.argv[1]) if len(sys.argv) > 1 else tiny()
    print(json.dumps(pretrain(cfg)))
