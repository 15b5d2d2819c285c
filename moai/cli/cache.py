"""`moai cache verify | list | prune | push | pull`: looking after the cache folder and the remote cache."""

from __future__ import annotations

import argparse

from moai.errors import ConfigError
from moai.presets import resolve_config


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
