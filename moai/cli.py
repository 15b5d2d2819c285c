"""`moai` command line: the pipeline without Prefect, for scripts and Slurm.

    moai plan CONFIG       print the resolved config and the hardware plan; run nothing
    moai prepare CONFIG    run convert → filter → [dedup, quality, language, decontaminate] →
                           save → tokenizer → tokenize → pack; the last stdout line is one
                           JSON object with the output paths
    moai train CONFIG      prepare, then `accelerate launch python -m moai.train`
    moai doctor [CONFIG]   check the set-up: pass/warn/fail with a fix for each
    moai tokenize-shard CONFIG --shard-index I --num-shards N
                           one unit of the tokenize stage (a Slurm array task)
    moai dedup-shard CONFIG --shard-index I --num-shards N
                           one unit of the dedup signatures (a Slurm array task)
    moai merge CONFIG      publish the token store from the units, then pack
    moai export-webdataset CONFIG --out DIR [--shard-size 256MB]
                           packed samples as WebDataset tar shards
    moai cache verify [CONFIG | CACHE_DIR]
                           check every published stage output against its manifest
                           (sizes and xxh3-128 digests); exit 1 if any is damaged
    moai cache list [CONFIG | CACHE_DIR]
                           entries (stage, key, size, age, config), leftovers, stray locks
    moai cache prune [CONFIG | CACHE_DIR] [--keep CONFIG]... [--older-than 30d] [--dry-run]
                           remove leftovers; with --keep/--older-than, entries too
    moai cache push CONFIG | pull CONFIG [--all] | list CONFIG --remote
                           the config's remote_cache: upload, download (digests checked), list

CONFIG is a YAML/JSON file or a preset name (`tiny`). Logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import NoReturn

from moai.config import read_env
from moai.errors import ConfigError, DataError, MoaiError
from moai.presets import resolve_config


def _plan_cmd(args: argparse.Namespace) -> int:
    from moai import preflight
    from moai.hardware import detect, plan

    config = resolve_config(args.config)
    checks = preflight.run(config)
    preflight.first_failure(checks)  # a mistake is the one `moai: error:` line, exit 2
    hw = detect(config.cache_dir)
    p = plan(hw, config, read_env())
    print("# resolved config")
    print(json.dumps(config.model_dump(mode="json", by_alias=True), indent=2))
    print("# hardware")
    print(json.dumps(p.to_dict()["hardware"], indent=2))
    print("# plan")
    width = max(len(r["setting"]) for r in p.rows())
    for r in p.rows():
        print(f"{r['setting']:<{width}}  {r['value']:<8}  {r['reason']}")
    print("# checks")
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(
            f"{c.status:<4}  {c.name:<{width}}  {c.detail}"
            + (f"; fix: {c.fix}" if c.status == "warn" and c.fix else "")
        )
    return 0


class _Terse(logging.Formatter):
    """Without -v: a warning is `moai: warning: ...`, like the errors (no time, no logger name)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"moai: {record.levelname.lower()}: {record.getMessage()}"


def _set_up_logging(verbose: bool) -> None:
    """The stage table and warnings on stderr; the library's INFO records (what was published,
    reused, which engine) only with -v, with their time and logger."""
    handler = logging.StreamHandler(sys.stderr)
    if verbose:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(_Terse())
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, handlers=[handler])


def _print_stages(result: dict) -> None:
    """The per-stage summary on stderr: built or reused, rows in → out, dropped by reason, seconds."""
    from moai.report import stage_table

    stages = result.get("stages", {})
    for line in stage_table(stages):
        print(f"moai: {line}", file=sys.stderr, flush=True)
    # A stage built now logged its warnings as it ran; a reused one says them again, every command.
    for s in stages.values():
        if not s.get("built"):
            for warning in s.get("warnings") or []:
                print(f"moai: warning: {warning}", file=sys.stderr, flush=True)


def _quiet_progress() -> None:
    """--no-progress: no bars from datasets, transformers or the hub, here and in the training
    processes (they inherit the environment)."""
    import os

    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()


def _prepare_cmd(args: argparse.Namespace) -> int:
    from moai.pipeline import prepare
    from moai.preflight import require

    config = resolve_config(args.config)
    require(config, resume=False)  # the model is checked against the data settings; output_dir is not
    result = prepare(config, progress=not args.no_progress and sys.stderr.isatty())
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


def _trace_cmd(args: argparse.Namespace) -> int:
    from moai.pipeline import prepare
    from moai.trace import Tracer, document_history, format_samples, sample_json, top_loss_steps

    config = resolve_config(args.config)
    if config.train is None:
        raise ConfigError(f"{args.config}: no train section: moai trace follows the samples training reads")
    if sum(x is not None for x in (args.step, args.top_loss, args.document)) != 1:
        raise ConfigError("moai trace: give one of --step N, --top-loss K or --document FILE:ROW")
    if args.document is not None:
        print(json.dumps(document_history(config, prepare(config, progress=False), args.document, args.world_size)))
        return 0
    if args.top_loss is not None:
        steps = top_loss_steps(os.path.join(config.train.output_dir, "metrics.jsonl"), args.top_loss, args.by)
    else:
        steps = [{"step": args.step}]
    tracer = Tracer(config, prepare(config, progress=False), args.world_size)  # None: each launch's, from metrics
    traced = [{**s, **tracer.step_record(s["step"], args.rank, args.micro_batch)} for s in steps]
    if args.json:
        print(json.dumps([{**t, "samples": [sample_json(x) for x in t["samples"]]} for t in traced]))
        return 0
    for t in traced:
        loss = f" (loss {t['loss']}, {t['jump']:+} over the 10 logged before)" if "loss" in t else ""
        lines = format_samples(t["step"], t["samples"])
        print(lines[0] + loss + f", world size {t['world_size']}")
        print("\n".join(lines[1:]))
    return 0


def _doctor_cmd(args: argparse.Namespace) -> int:
    from moai.doctor import evaluate, gather

    config = resolve_config(args.config) if args.config else None
    checks = evaluate(gather(config))
    marks = {"pass": "✔ pass", "warn": "! warn", "fail": "✘ fail"}
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"{marks[c.status]}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status != "pass":
            print(f"{'':8}  {'':<{width}}  fix: {c.fix}")
    failed = sum(c.status == "fail" for c in checks)
    print(
        f"{len(checks)} checks: {sum(c.status == 'pass' for c in checks)} pass, "
        f"{sum(c.status == 'warn' for c in checks)} warn, {failed} fail"
    )
    return 1 if failed else 0


def _cache_dir_of(args: argparse.Namespace) -> str:
    """--cache-dir, else the positional argument as a folder, else the cache_dir of that config or
    preset, else the default cache_dir."""
    from pathlib import Path

    from moai.config import PipelineConfig

    if args.cache_dir:
        return args.cache_dir
    if args.target is None:
        return PipelineConfig.model_fields["cache_dir"].default
    if Path(args.target).is_dir():
        return args.target
    return resolve_config(args.target).cache_dir


def _cache_verify_cmd(args: argparse.Namespace) -> int:
    from moai.cache import DAMAGED, OK, UNVERIFIABLE, verify_cache

    counts = {OK: 0, DAMAGED: 0, UNVERIFIABLE: 0}
    # A line per entry as soon as it is checked: reading a big cache takes a while.
    for entry in verify_cache(_cache_dir_of(args)):
        counts[entry.status] += 1
        if entry.status != OK:
            print(entry.message, flush=True)
        if entry.status == DAMAGED and args.all_problems:
            for problem in entry.problems[1:]:
                print(f"  also: {problem}")
    print(f"{counts[OK]} entries ok, {counts[DAMAGED]} damaged, {counts[UNVERIFIABLE]} unverifiable")
    return 1 if counts[DAMAGED] else 0


def _cache_list_cmd(args: argparse.Namespace) -> int:
    from moai.cache import list_lines, scan

    if args.remote:
        return _cache_remote_cmd(args)
    for line in list_lines(scan(_cache_dir_of(args))):
        print(line)
    return 0


def _cache_remote_cmd(args: argparse.Namespace) -> int:
    """`moai cache push|pull CONFIG`, `moai cache list CONFIG --remote`: the config's remote_cache."""
    from pathlib import Path

    from moai import remote_cache

    if args.target is None or Path(args.target).is_dir():
        raise ConfigError(f"moai cache {args.cache_command} works on a config's remote_cache: give the config file")
    config = resolve_config(args.target)
    remote = remote_cache.remote_of(config)
    if remote is None:
        raise ConfigError(f"{args.target} sets no remote_cache: add remote_cache: s3://bucket/prefix to it")
    root = Path(config.cache_dir)
    if args.cache_command == "push":
        done, there = remote_cache.push_all(root, remote)
        print(f"{done} entries uploaded to {remote.url}, {there} already there")
    elif args.cache_command == "pull":
        from moai.cache import needed_keys

        done, there = remote_cache.pull_all(root, remote, None if args.all else needed_keys(config))
        print(f"{done} entries pulled from {remote.url} into {root}, {there} already here")
    else:
        entries = remote.entries()
        for e in entries:
            print(f"{e.stage:<12} {e.key}  {e.url}")
        print(f"{len(entries)} entries in {remote.url}")
    return 0


def _cache_prune_cmd(args: argparse.Namespace) -> int:
    from moai.cache import needed_keys, parse_age, prune, prune_lines

    older = parse_age(args.older_than) if args.older_than else None
    keep = set().union(*(needed_keys(resolve_config(c)) for c in args.keep)) if args.keep else None
    pruned = prune(_cache_dir_of(args), keep=keep, older_than_s=older, dry_run=args.dry_run)
    for line in prune_lines(pruned, args.dry_run):
        print(line)
    return 0


def environment_error(err: OSError) -> str | None:
    """One line for a fault of the machine (permissions, read-only or full disk), naming the path
    and the fix; None for any other OSError (a bug of moai's: its traceback is kept)."""
    import errno
    import shlex

    from moai.hardware import free_bytes

    where = err.filename or "a file moai writes"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        free = f" ({free_bytes(err.filename) / 1e9:.2f} GB free there now)" if err.filename else ""
        return (
            f"no space left writing {where}{free}: free disk space or move cache_dir (or train.output_dir) "
            "to a bigger disk; nothing half-written is kept, rerun to continue"
        )
    if err.errno in (errno.EACCES, errno.EPERM) and err.filename and (blocked := unreadable(err.filename)):
        return (
            f"permission denied: {where}: moai cannot read {blocked}; make it readable by this user "
            f"(chmod a+r{'x' if os.path.isdir(blocked) else ''} {shlex.quote(blocked)}, or chown), "
            "or point the setting that names it (source.path, tokenizer.path, ...) at a copy you can read"
        )
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = "read-only file system" if err.errno == errno.EROFS else "permission denied"
        return f"{what}: {where}: make it writable, or set cache_dir (or train.output_dir) to a folder you can write"
    return None


def unreadable(path: str) -> str | None:
    """The first part of `path` this process may not read: a folder it cannot enter, or the file
    itself; None when it can read all of it (a permission error there came from writing)."""
    folder, folders = os.path.dirname(os.path.abspath(path)), []
    while folder not in folders:  # the root is its own dirname
        folders.append(folder)
        folder = os.path.dirname(folder)
    for folder in reversed(folders):
        if os.path.isdir(folder) and not os.access(folder, os.X_OK):
            return folder
    if os.path.isdir(path):
        return None if os.access(path, os.R_OK | os.X_OK) else path
    if os.path.exists(path) and not os.access(path, os.R_OK):
        return path
    return None


EXAMPLES = {
    "plan": "examples:\n  moai plan tiny\n  moai plan examples/quickstart.yaml",
    "prepare": "examples:\n  moai prepare examples/quickstart.yaml\n"
    "  moai prepare my.yaml --no-progress | tail -1 | jq .token_store",
    "train": "examples:\n  moai train examples/quickstart.yaml\n"
    "  moai train my.yaml --num-machines 2 --machine-rank 0 --main-process-ip 10.0.0.1 --main-process-port 29500",
    "dedup-shard": "examples:\n"
    "  moai dedup-shard my.yaml --shard-index $SLURM_ARRAY_TASK_ID --num-shards 8   # sbatch --array=0-7\n"
    "  moai merge my.yaml   # then: the clustering, the other stages, the token store",
    "tokenize-shard": "examples:\n  moai tokenize-shard my.yaml --shard-index 0 --num-shards 32\n"
    "  moai tokenize-shard my.yaml --shard-index $SLURM_ARRAY_TASK_ID --num-shards 32   # sbatch --array=0-31",
    "merge": "examples:\n  moai merge my.yaml --num-shards 32",
    "export-webdataset": "examples:\n  moai export-webdataset my.yaml --out /data/wds --shard-size 256MB\n"
    "  moai export-webdataset my.yaml --out /data/wds-val --split validation",
    "trace": "examples:\n  moai trace my.yaml --step 41000\n  moai trace my.yaml --top-loss 3 --json\n"
    "  moai trace my.yaml --step 12 --rank 0 --micro-batch 1\n  moai trace my.yaml --document data/a.jsonl:12",
    "doctor": "examples:\n  moai doctor\n  moai doctor examples/quickstart.yaml",
    "cache": "examples:\n  moai cache verify my.yaml\n  moai cache list\n  moai cache prune --keep my.yaml --dry-run",
}


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake is one `moai: error:` line too, pointing at the command's --help (which has examples)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"moai: error: {message} (see: {self.prog} --help)\n")


def _add_parser(sub, name: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand with its examples under its --help."""
    p = sub.add_parser(name, epilog=EXAMPLES.get(name), formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
    # -v after the command too (`moai prepare my.yaml -v`); SUPPRESS keeps a -v given before it
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")
    return p


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, like KeyboardInterrupt, so no `except Exception`
    swallows it: it unwinds the command, running every cleanup on the way."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_MAIN_PID: int | None = None  # the process that runs the command (forked workers inherit the handler)


def _on_signal(signum: int, frame) -> None:
    if os.getpid() != _MAIN_PID:
        # A forked worker: its parent stops it. Ctrl-C reaches the whole process group, and a
        # worker's own KeyboardInterrupt would print a traceback; SIGTERM (the parent's) ends it.
        if signum == signal.SIGTERM:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_second_signal)
    _stop_workers()
    raise Interrupted(signum)


def _unraisable(unraisable) -> None:
    """An `Interrupted` raised where Python can only print and drop it (a `__del__`, a weakref
    callback): no traceback; it is raised again 50 ms later from a timer (SIGALRM), by then out of
    that spot (or, if not, dropped here and timed again), so the command still stops, one line."""
    err = unraisable.exc_value
    if isinstance(err, Interrupted) and os.getpid() == _MAIN_PID:
        try:
            signal.signal(signal.SIGALRM, lambda _s, _f: _raise_again(err.signum))
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        except ValueError:  # not the main thread: nothing to time it from
            pass
    _previous_unraisablehook(unraisable)


def _raise_again(signum: int) -> None:
    raise Interrupted(signum)


_previous_unraisablehook = sys.unraisablehook  # what main() found (pytest's, in a test)


def _install_handlers() -> None:
    """Ctrl-C and SIGTERM (a scheduler, `kill`) unwind the command: a stage being built drops its
    temporary folder, a launch takes its process group down; then one line, exit 130 or 143."""
    global _MAIN_PID, _previous_unraisablehook
    _MAIN_PID = os.getpid()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)
    if sys.unraisablehook is not _unraisable:
        _previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _unraisable


def _on_second_signal(signum: int, frame) -> None:
    """Asked again while cleaning up: leave at once (a stage's temporary folder is removed by its next build)."""
    print(f"moai: interrupted again ({signal.Signals(signum).name}); leaving at once", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def _stop_workers() -> None:
    """Terminate this process's worker processes (pools of multiprocessing and multiprocess), so a
    pool being unwound does not wait for the work still queued on them."""
    for name in ("multiprocessing", "multiprocess"):
        module = sys.modules.get(name)
        if module is None:
            continue
        for child in module.active_children():
            child.terminate()


def _interrupted(signum: int) -> int:
    """The one line for an interrupted command; its exit code (128 + the signal)."""
    print(
        f"moai: interrupted ({signal.Signals(signum).name}); nothing half-written is kept: rerun the same "
        "command to continue",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="moai", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    from moai import __version__

    parser.add_argument("--version", action="version", version=f"moai {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = _add_parser(sub, "plan", help="print the resolved config and hardware plan")
    p.add_argument("config", help="config file (YAML/JSON) or preset name")
    p.set_defaults(func=_plan_cmd)
    p = _add_parser(sub, "prepare", help="run the data stages")
    p.add_argument("config", help="config file (YAML/JSON) or preset name")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_prepare_cmd)
    p = _add_parser(sub, "train", help="run the data stages, then accelerate launch the training")
    p.add_argument("config", help="config file (YAML/JSON) or preset name")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--num-machines", type=int, help="override train.num_machines (multi-node)")
    p.add_argument("--machine-rank", type=int, help="override train.machine_rank: this node's rank")
    p.add_argument("--main-process-ip", help="override train.main_process_ip: the rank-0 node")
    p.add_argument("--main-process-port", type=int, help="override train.main_process_port")
    p.set_defaults(func=_train_cmd)
    p = _add_parser(sub, "tokenize-shard", help="one unit of the tokenize stage (Slurm array task); safe to rerun")
    p.add_argument("config", help="config file (YAML/JSON) or preset name")
    p.add_argument("--shard-index", type=int, required=True, help="this unit, 0 to NUM_SHARDS-1")
    p.add_argument(
        "--num-shards", type=int, required=True, help="how many units the tokenize stage is cut into (the same for all)"
    )
    p.set_defaults(func=_shard_cmd, unit_stage="tokenize")
    p = _add_parser(
        sub, "dedup-shard", help="one unit of the dedup signatures (Slurm array task, before merge); safe to rerun"
    )
    p.add_argument("config", help="config file (YAML/JSON) or preset name")
    p.add_argument("--shard-index", type=int, required=True, help="this unit, 0 to NUM_SHARDS-1")
    p.add_argument(
        "--num-shards", type=int, required=True, help="how many units the signatures are cut into (the same for all)"
    )
    p.set_defaults(func=_shard_cmd, unit_stage="signatures")
    p = _add_parser(sub, "merge", help="publish the token store from all tokenize-shard units, then pack")
    p.add_argument("config", help="config file (YAML/JSON) or preset name")
    p.add_argument("--num-shards", type=int, help="to name the shards that still have to run")
    p.set_defaults(func=_merge_cmd)
    p = _add_parser(sub, "export-webdataset", help="write packed samples as WebDataset tar shards")
    p.add_argument("config", help="config file (YAML/JSON) or preset name")
    p.add_argument("--out", required=True, help="an empty folder for shard-00000.tar, ... and manifest.json")
    p.add_argument("--shard-size", default="256MB", help="largest shard, e.g. 256MB (default)")
    p.add_argument(
        "--split", default="train", choices=["train", "validation"], help="which split's samples (default: train)"
    )
    p.set_defaults(func=_export_cmd)
    p = _add_parser(sub, "trace", help="the documents (source, file:row) an optimizer step trained on")
    p.add_argument("config", help="config file (YAML/JSON) or preset name")
    p.add_argument("--step", type=int, help="the step as metrics.jsonl numbers it (1 = the first)")
    p.add_argument("--top-loss", type=int, metavar="K", help="the K logged steps of highest loss in metrics.jsonl")
    p.add_argument(
        "--document",
        metavar="FILE:ROW",
        help="what happened to a source row: dropped by which stage and why, or "
        "the document it became and the samples and steps that read it",
    )
    p.add_argument(
        "--by",
        choices=["loss", "jump"],
        default="loss",
        help="--top-loss ranks steps by loss (default) or by the jump over the mean of the 10 logged losses before",
    )
    p.add_argument("--rank", type=int, help="only this rank's samples")
    p.add_argument("--micro-batch", type=int, help="only this micro-batch (of train.grad_accum_steps)")
    p.add_argument("--world-size", type=int, help="ranks every step trained with (default: each launch's)")
    p.add_argument("--json", action="store_true", help="one JSON list on stdout")
    p.set_defaults(func=_trace_cmd)
    p = _add_parser(sub, "doctor", help="check this machine's set-up; non-zero exit on any failure")
    p.add_argument("config", nargs="?", help="config file or preset to check the tokenizer and plan of")
    p.set_defaults(func=_doctor_cmd)
    p = _add_parser(sub, "cache", help="look after the cache: moai cache verify | list | prune | push | pull")
    cache_sub = p.add_subparsers(dest="cache_command", required=True)
    target_help = "a config file or preset (its cache_dir), or a cache folder; default: .moai"
    p = cache_sub.add_parser(
        "verify", help="check every published stage output against its manifest; exit 1 if any is damaged"
    )
    p.add_argument("target", nargs="?", metavar="CONFIG_OR_CACHE_DIR", help=target_help)
    p.add_argument("--cache-dir", help="the cache folder to check")
    p.add_argument(
        "--all-problems", action="store_true", help="list every problem of a damaged entry, not only the first"
    )
    p.set_defaults(func=_cache_verify_cmd)
    p = cache_sub.add_parser(
        "list", help="every entry (stage, key, size, age, config that used it), leftover and stray lock; in use or not"
    )
    p.add_argument("target", nargs="?", metavar="CONFIG_OR_CACHE_DIR", help=target_help)
    p.add_argument("--cache-dir", help="the cache folder to list")
    p.add_argument("--remote", action="store_true", help="list the config's remote_cache instead")
    p.set_defaults(func=_cache_list_cmd)
    p = cache_sub.add_parser("push", help="upload every local entry the config's remote_cache lacks")
    p.add_argument("target", metavar="CONFIG", help="the config whose cache_dir and remote_cache to use")
    p.set_defaults(func=_cache_remote_cmd)
    p = cache_sub.add_parser("pull", help="download from the config's remote_cache the entries it needs")
    p.add_argument("target", metavar="CONFIG", help="the config whose cache_dir and remote_cache to use")
    p.add_argument("--all", action="store_true", help="every entry of the remote, not only those the config needs")
    p.set_defaults(func=_cache_remote_cmd)
    p = cache_sub.add_parser(
        "prune",
        help="remove leftovers of dead builds and stray locks (default); with --keep/--older-than, entries too; "
        "never what a running build holds",
        epilog="examples:\n  moai cache prune                       # leftovers only\n"
        "  moai cache prune --keep a.yaml --keep b.yaml --dry-run\n"
        "  moai cache prune /scratch/cache --older-than 30d",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", nargs="?", metavar="CONFIG_OR_CACHE_DIR", help=target_help)
    p.add_argument("--cache-dir", help="the cache folder to prune")
    p.add_argument(
        "--keep",
        action="append",
        metavar="CONFIG",
        help="remove every entry these configs do not need (repeat for several; computing their keys reads "
        "their source files)",
    )
    p.add_argument("--older-than", metavar="AGE", help="remove entries last used longer ago than AGE: 30d, 12h, 2w")
    p.add_argument("--dry-run", action="store_true", help="print what would go and the bytes freed; remove nothing")
    p.set_defaults(func=_cache_prune_cmd)
    args = parser.parse_args(argv)
    _set_up_logging(args.verbose)
    _install_handlers()
    # Bars are for a terminal: a job log (Slurm, a redirect) gets none, whatever the command.
    if getattr(args, "no_progress", False) or not sys.stderr.isatty():
        _quiet_progress()
    try:
        return args.func(args)
    except (Interrupted, KeyboardInterrupt) as err:
        return _interrupted(err.signum if isinstance(err, Interrupted) else signal.SIGINT)
    except MoaiError as err:
        for line in str(err).splitlines():  # several independent mistakes: one line each
            print(f"moai: error: {line}", file=sys.stderr)
        return 2
    except OSError as err:
        fault = environment_error(err)
        if fault is None:
            raise
        logging.getLogger("moai").debug("environment error", exc_info=True)
        print(f"moai: error: {fault}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
