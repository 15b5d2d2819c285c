"""The argument parser: every command, its options and the examples under its --help."""

from __future__ import annotations

import argparse
from typing import NoReturn

from moai.cli.cache import _cache_list_cmd, _cache_prune_cmd, _cache_remote_cmd, _cache_verify_cmd
from moai.cli.run import _export_cmd, _merge_cmd, _prepare_cmd, _shard_cmd, _train_cmd
from moai.cli.show import _doctor_cmd, _plan_cmd, _trace_cmd

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


def build_parser(description: str | None) -> OneLineParser:
    parser = OneLineParser(prog="moai", description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    return parser
