"""The commands that run the pipeline: prepare, train, the Slurm units and merge, export-webdataset."""

from __future__ import annotations

import argparse
import json
import sys

from moai.cli.output import _print_stages
from moai.config import read_env
from moai.errors import ConfigError, DataError
from moai.presets import resolve_config


def _prepare_cmd(args: argparse.Namespace) -> int:
    from moai.pipeline import prepare
    from moai.preflight import require

    config = resolve_config(args.config)
    # the model is checked against the data settings (output_dir is not), before any stage runs
    result = prepare(
        config, progress=not args.no_progress and sys.stderr.isatty(), first=lambda: require(config, resume=False)
    )
    _print_stages(result)
    print(json.dumps(result))
    return 0


def _train_cmd(args: argparse.Namespace) -> int:
    from moai.hardware import detect, plan as make_plan
    from moai.launch import TrainingFailed, is_progress_line
    from moai.pipeline import launch_training, prepare
    from moai.preflight import require
    from moai.train.checkpoint import resume_plan

    config = resolve_config(args.config)
    overrides = {
        k: getattr(args, k)
        for k in ("num_machines", "machine_rank", "main_process_ip", "main_process_port")
        if getattr(args, k) is not None
    }
    if overrides:
        if config.train is None:
            raise ConfigError(f"{args.config}: no train section to apply {sorted(overrides)} to")
        from moai.config import parse_config

        data = config.model_dump(mode="json", by_alias=True)
        data["train"].update(overrides)
        config = parse_config(data, origin=f"{args.config} with {overrides}")
    # Decided before anything else: a finished run (nothing to check or prepare), or a checkpoint
    # made with other settings.
    hw_plan = make_plan(detect(config.cache_dir, with_gpus=True), config, read_env())
    decided = resume_plan(config, num_gpus=len(hw_plan.hardware.gpus))
    if decided.status == "finished":
        print(f"moai: {decided.detail}", file=sys.stderr)
        return 0
    require(config, resume=False)  # output_dir was just decided, with the GPUs known
    prepared = prepare(config, progress=not args.no_progress and sys.stderr.isatty())
    _print_stages(prepared)

    def show(line: str) -> None:  # metrics and the ranks' log records; everything is in the log file
        if is_progress_line(line):
            print(line, flush=True)

    try:
        last = launch_training(config, prepared, on_line=show, plan=hw_plan)
    except TrainingFailed as err:
        print(f"moai: error: {err}", file=sys.stderr)
        return 1
    print(json.dumps({**prepared, "train": last}))
    return 0


def _shard_cmd(args: argparse.Namespace) -> int:
    from moai.pipeline import run_units

    # Decided before any stage runs: a bad index would otherwise fail only after the stages before tokenize.
    if args.num_shards < 1:
        raise ConfigError(f"--num-shards {args.num_shards}: must be at least 1")
    if not 0 <= args.shard_index < args.num_shards:
        raise ConfigError(
            f"--shard-index {args.shard_index} is out of range for --num-shards {args.num_shards}: "
            f"use 0 to {args.num_shards - 1} (Slurm: --array=0-{args.num_shards - 1})"
        )
    print(json.dumps(run_units(resolve_config(args.config), args.unit_stage, args.shard_index, args.num_shards)))
    return 0


def _merge_cmd(args: argparse.Namespace) -> int:
    from moai.pipeline import merge

    if args.num_shards is not None and args.num_shards < 1:
        raise ConfigError(f"--num-shards {args.num_shards}: must be at least 1")
    result = merge(resolve_config(args.config), args.num_shards)
    _print_stages(result)
    print(json.dumps(result))
    return 0


def _export_cmd(args: argparse.Namespace) -> int:
    from moai.formats.webdataset import export_webdataset
    from moai.pipeline import prepare

    config = resolve_config(args.config)
    prepared = prepare(config, progress=False)
    if not prepared["sample_index"]:
        raise DataError("export-webdataset writes packed samples: set pack.enabled: true")
    manifest = export_webdataset(prepared["sample_index"], args.out, split=args.split, shard_size=args.shard_size)
    print(
        json.dumps(
            {k: v for k, v in manifest.items() if k != "shards"}
            | {"num_shards": len(manifest["shards"]), "out": str(args.out)}
        )
    )
    return 0
