"""Would a short timing on a sample pick the engine that runs the whole corpus fastest?

    python benchmarks/sample_timing.py --tokenizer bench/tok-tekken --corpus bench/kopure.jsonl \\
        --text-template $'{instruction}\\n{input}\\n{output}' --mb 1 --rounds 4 --seeds 0 1

fastokens and gigatoken are built for the tokenizer, each encodes one warm-up sample, then
`--rounds` fresh samples of `--mb` MB of records drawn at random from the corpus (different
records each round: encoding the same texts again would time warm caches) are encoded by both,
the order alternating, each as the tokenize stage calls it on 2 cores: four batches over two
threads, `str`s made from Arrow text inside the timing for fastokens, the Arrow text itself for
gigatoken, EOS after each document. Prints each engine's MB/s over all rounds, per seed. Compare
with the stage itself on the whole corpus (`prepare_e2e.py --engine`, docs/tokenize-engines.md).
"""

from __future__ import annotations

import os
import sys

# This folder's tokenize.py shadows the standard library's `tokenize` when a script here runs.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer folder")
    parser.add_argument("--corpus", required=True, help="JSONL records")
    parser.add_argument("--text-template", default="{text}", help="how a record becomes its text")
    parser.add_argument("--mb", type=float, default=1.0, help="MB of text a round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()

    import numpy as np
    import pyarrow as pa

    from moai.stages.tokenize import engines
    from moai.stages.tokenize.engine import engine_setup
    from moai.stages.tokenizer import describe, load_tokenizer

    lines = Path(args.corpus).read_text(encoding="utf-8").splitlines()
    info = describe(load_tokenizer(args.tokenizer), args.tokenizer, "")
    engines.size_fastokens_pool(2)
    fast = engines.build(engine_setup("fastokens", info, 2))
    giga = engines.build(engine_setup("gigatoken", info, 2))

    def run(encoder, arr, ex) -> float:
        arrow = getattr(encoder, "takes_arrow", False)
        cuts = np.linspace(0, len(arr), 5).astype(int)
        batches = [arr.slice(a, b - a) for a, b in itertools.pairwise(cuts)]

        def call(batch):
            encoder.encode_documents(batch if arrow else batch.to_pylist(), info.eos_id)

        t0 = time.perf_counter()
        list(ex.map(call, batches))
        return time.perf_counter() - t0

    for seed in args.seeds:
        order = iter(np.random.default_rng(seed).permutation(len(lines)))

        def sample(order=order):
            texts, size = [], 0
            while size < args.mb * 1e6:
                text = args.text_template.format_map(json.loads(lines[next(order)]))
                texts.append(text)
                size += len(text.encode())
            return pa.array(texts, type=pa.large_string()), size / 1e6

        seconds = {"fastokens": 0.0, "gigatoken": 0.0}
        total = 0.0
        with ThreadPoolExecutor(2) as ex:
            warm, _ = sample()
            run(fast, warm, ex)
            run(giga, warm, ex)
            for r in range(args.rounds):
                arr, mb = sample()
                pair = [("fastokens", fast), ("gigatoken", giga)]
                for name, encoder in pair if r % 2 == 0 else pair[::-1]:
                    seconds[name] += run(encoder, arr, ex)
                total += mb
        rates = ", ".join(f"{name} {total / s:,.0f} MB/s" for name, s in seconds.items())
        print(f"seed {seed}: {args.rounds} x {args.mb:g} MB of {args.corpus}: {rates}", flush=True)


if __name__ == "__main__":
    main()
