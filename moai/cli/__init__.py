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

import logging
import signal
import sys

from moai.cli.output import _quiet_progress, _set_up_logging, environment_error, unreadable
from moai.cli.parser import EXAMPLES, OneLineParser, build_parser
from moai.cli.signals import Interrupted, _install_handlers, _interrupted
from moai.errors import MoaiError

__all__ = [
    "EXAMPLES",
    "Interrupted",
    "OneLineParser",
    "build_parser",
    "environment_error",
    "main",
    "unreadable",
]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__)
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
