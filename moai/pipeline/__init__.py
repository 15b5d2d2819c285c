"""The stage graph: every stage declared once, one function computes keys, one walks the graph.

A stage is a module (`moai/stages/*.py`) that declares

    NAME                     its folder in the store: <cache_dir>/<NAME>/<key>/
    VERSION                  bumped when the stage's output changes, so old caches rebuild
    READS or reads(config)   the stages (or roots) it reads, in order
    settings(config) -> dict what in the config changes its output
    build(ctx, out) -> dict  writes `out` from `ctx.inputs`, returns the report
    enabled(config) -> bool  optional; a stage that is off is skipped with everything reading it

`REGISTRY` (`graph.py`) lists the stages in order; adding a stage is one module and one line
there (or `register(...)`). A stage's key hashes its name, VERSION, settings and the keys of what it reads
(`key_of`), so a key is known before anything runs. The roots of the keys are fingerprints of
content (`ROOTS`): the source files (or the hub dataset's fingerprint) and a given tokenizer's
files. `walk` (`walk.py`) runs the stages in order through one `run` function: `run_stage` (build
once through the store, or reuse), a Prefect task in `flows/pretrain.py`. `moai prepare`, `moai merge`,
`moai tokenize-shard` and the flow all walk this same graph.

With several sources (`sources:`), the graph has one node per stage and source for the stages
that read a source (`convert[ko]`, `filter[ko]`, ..., `tokenize[ko]`): each runs the stage on the
config `moai.sources.source_config` derives for its source, reads that source's nodes under the
stage names (`ctx.path("save")`), and is stored as `<cache_dir>/<stage>/<key>/` under the key a
single-source config of that source would have. A stage declaring `COMBINES = True` (the trained
tokenizer, `mix`) is one node that reads every source's node (`ctx.per_source("tokenize")`).

The run's one-line result is `summary.py`; training on it, `training.py`. Every name is imported
from `moai.pipeline` itself.
"""

from __future__ import annotations

from moai.pipeline.graph import (
    REGISTRY,
    ROOTS,
    BuildContext,
    Inputs,
    Node,
    Stage,
    StageResult,
    key_of,
    node,
    node_config,
    node_name,
    nodes,
    register,
    roots,
    split_name,
    stage,
    stage_inputs,
    stages,
    upstream,
)
from moai.pipeline.summary import summary
from moai.pipeline.training import DAMAGED_DATA, launch_training, with_damaged_data_hint
from moai.pipeline.walk import (
    UNIT_STAGES,
    Run,
    is_published,
    merge,
    prepare,
    run_stage,
    run_units,
    tokenize_shard,
    walk,
)

__all__ = [
    "DAMAGED_DATA",
    "REGISTRY",
    "ROOTS",
    "UNIT_STAGES",
    "BuildContext",
    "Inputs",
    "Node",
    "Run",
    "Stage",
    "StageResult",
    "is_published",
    "key_of",
    "launch_training",
    "merge",
    "node",
    "node_config",
    "node_name",
    "nodes",
    "prepare",
    "register",
    "roots",
    "run_stage",
    "run_units",
    "split_name",
    "stage",
    "stage_inputs",
    "stages",
    "summary",
    "tokenize_shard",
    "upstream",
    "walk",
    "with_damaged_data_hint",
]
