"""`python -m moai.train --config RESOLVED.json`: one training process, as `accelerate launch` starts it.

Parse the arguments, log to stderr with the rank in every line, then read and validate
RESOLVED.json (`ResolvedRun`) and train, under `guarded`: a failure, a bad RESOLVED.json
included, prints the one line `moai.launch` reports. Stdout carries only the metrics JSON lines.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from moai.train.loop import guarded, train
from moai.train.resolved import ResolvedRun


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moai.train", description="One training process (what `accelerate launch` runs)."
    )
    parser.add_argument("--config", required=True, help="RESOLVED.json written by moai.launch")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s [rank {os.environ.get('RANK', '0')}] %(levelname)s %(name)s: %(message)s",
    )
    guarded(lambda: train(ResolvedRun.read(args.config)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
