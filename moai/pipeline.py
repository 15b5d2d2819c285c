"""The stages chained on the store: convert → filter → save → tokenizer → tokenize → pack.

`Pipeline` knows each stage's key (a pure function of the config and the upstream key, so a
Prefect flow can compute it before running a task) and runs a stage through `Store.build`, which
reuses a published output or builds it once. `prepare` runs them all; `moai prepare` and the
Prefect flow both go through here, so they share one cache.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from moai.config import PipelineConfig, read_env
from moai.hardware import Plan, detect, plan as make_plan
from moai.stages import convert as convert_mod
from moai.stages import filter as filter_mod
from moai.stages import pack as pack_mod
from moai.stages import save as save_mod
from moai.stages import tokenize as tokenize_mod
from moai.stages import tokenizer as tokenizer_mod
from moai.store import Store, stage_key

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class StageResult:
    """What a stage hands downstream: where its output is, its key, its report, and whether it was built now."""

    stage: str
    key: str
    path: str
    report: dict[str, Any]
    built: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Pipeline:
    def __init__(self, config: PipelineConfig, plan: Plan | None = None, progress: bool = True,
                 on_progress: Callable[[str, float], None] | None = None):
        self.config = config
        self.store = Store(config.cache_dir)
        self._plan = plan
        self.progress = progress
        self.on_progress = on_progress  # (stage, fraction done) during long stages

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = make_plan(detect(self.config.cache_dir, with_gpus=False), self.config, read_env())
        return self._plan

    # -- keys: pure functions of the config and upstream keys -------------------------------------

    def settings(self, stage: str) -> tuple[int, dict[str, Any]]:
        c = self.config
        table: dict[str, tuple[int, dict[str, Any]]] = {
            "convert": (convert_mod.VERSION, convert_mod.settings(c.source)),
            "filter": (filter_mod.VERSION, c.filter.model_dump()),
            "save": (save_mod.VERSION, {**c.split.model_dump(), "max_shard_size": c.save.max_shard_size}),
            "tokenizer": (tokenizer_mod.VERSION, c.tokenizer.train.model_dump() if c.tokenizer.train else {}),
            # workers, threads, batch size do not change the output; the engine is checked to give the same ids
            "tokenize": (tokenize_mod.VERSION, {}),
            "pack": (pack_mod.VERSION, c.pack.model_dump(exclude={"enabled"})),
        }
        return table[stage]

    def key(self, stage: str, *upstream: str) -> str:
        version, settings = self.settings(stage)
        return stage_key(stage, version, list(upstream), settings)

    def is_published(self, stage: str, key: str) -> bool:
        return self.store.exists(stage, key)

    # -- stages ------------------------------------------------------------------------------------

    def _run(self, stage: str, key: str, upstream: list[str], build: Callable[[Path], dict[str, Any]]) -> StageResult:
        version, settings = self.settings(stage)
        pub = self.store.build(stage, key, build, manifest={"upstream": upstream, "settings": settings, "version": version})
        report = dict(pub.manifest["report"])
        log.info("%s: %s %s", stage, "built" if pub.built else "reused", pub.path)
        return StageResult(stage, key, str(pub.path), report, pub.built)

    def source_fingerprint(self) -> str:
        return convert_mod.source_fingerprint(self.config.source)

    def convert(self, source_fp: str) -> StageResult:
        key = self.key("convert", source_fp)
        return self._run("convert", key, [source_fp], lambda out: convert_mod.convert(
            self.config.source, out, source_fp=source_fp, writer_batch_size=self.plan.writer_batch_size.value,
            max_shard_size=self.config.save.max_shard_size))

    def filter(self, converted: StageResult) -> StageResult:
        key = self.key("filter", converted.key)
        return self._run("filter", key, [converted.key], lambda out: filter_mod.filter_text(
            self.config.filter, Path(converted.path), out, batch_size=self.plan.writer_batch_size.value,
            max_shard_size=self.config.save.max_shard_size))

    def save(self, filtered: StageResult) -> StageResult:
        key = self.key("save", filtered.key)
        return self._run("save", key, [filtered.key], lambda out: save_mod.save(
            self.config.split, Path(filtered.path), out, max_shard_size=self.config.save.max_shard_size))

    def tokenizer_key(self, saved_key: str) -> str:
        """Key of the tokenizer stage: a given tokenizer chains from its files' fingerprint (not
        from the text), a trained one from the saved text."""
        tcfg = self.config.tokenizer
        if tcfg.train is None:
            return self.key("tokenizer", tokenizer_mod.tokenizer_fingerprint(tcfg))
        return self.key("tokenizer", saved_key)

    def tokenizer(self, saved: StageResult) -> StageResult:
        """A given tokenizer is checked once and copied into the store (so the token store's
        tokenizer cannot change under it); a trained one is trained once. Reruns read the manifest."""
        tcfg = self.config.tokenizer
        key = self.tokenizer_key(saved.key)
        if tcfg.train is None:
            return self._run("tokenizer", key, [tcfg.path], lambda out: tokenizer_mod.adopt_tokenizer(
                tcfg.path, out, trust_remote_code=tcfg.trust_remote_code))
        return self._run("tokenizer", key, [saved.key], lambda out: tokenizer_mod.train_tokenizer(
            tcfg.train, Path(saved.path), out, batch_size=self.plan.batch_size.value))

    def tokenize(self, saved: StageResult, tok: StageResult) -> StageResult:
        key = self.key("tokenize", saved.key, tok.key)
        if self.store.exists("tokenize", key):
            return self._run("tokenize", key, [saved.key, tok.key], _never)
        info = self._tokenizer_info(tok)
        p = self.plan
        return self._run("tokenize", key, [saved.key, tok.key], lambda out: tokenize_mod.tokenize(
            info, Path(saved.path), out, num_proc=p.num_proc.value, threads_per_proc=p.threads_per_proc.value,
            batch_size=p.batch_size.value, engine=self.config.tokenize.engine, progress=self.progress,
            on_progress=(lambda f: self.on_progress("tokenize", f)) if self.on_progress else None))

    def _tokenizer_info(self, tok: StageResult):
        tcfg = self.config.tokenizer
        loaded = tokenizer_mod.load_tokenizer(tok.path, tcfg.trust_remote_code and tcfg.train is None)
        return tokenizer_mod.describe(loaded, tcfg.path or tok.path, tok.key, path=tok.path)

    def tokenize_shard(self, saved: StageResult, tok: StageResult, shard_index: int, num_shards: int) -> dict[str, Any]:
        """One unit of the tokenize stage (see `moai.shards`); the merged store is `tokenize_merged`."""
        from moai import shards

        key = self.key("tokenize", saved.key, tok.key)
        p = self.plan
        return shards.run_shard(self.store, key, self._tokenizer_info(tok), Path(saved.path), shard_index=shard_index,
                                num_shards=num_shards, batch_size=p.batch_size.value,
                                threads=p.threads_per_proc.value * p.num_proc.value,
                                engine=self.config.tokenize.engine)

    def tokenize_merged(self, saved: StageResult, tok: StageResult, num_shards: int | None = None) -> StageResult:
        """Publish the token store from the shards' parts; the same key and folder as `tokenize`."""
        from moai import shards

        key = self.key("tokenize", saved.key, tok.key)
        if self.store.exists("tokenize", key):
            return self._run("tokenize", key, [saved.key, tok.key], _never)
        info = self._tokenizer_info(tok)
        return self._run("tokenize", key, [saved.key, tok.key], lambda out: shards.merge(
            self.store, key, info, Path(saved.path), out, num_shards))

    def pack(self, tokens: StageResult) -> StageResult:
        key = self.key("pack", tokens.key)
        ref = str(Path(tokens.path).relative_to(self.store.root))
        return self._run("pack", key, [tokens.key], lambda out: pack_mod.pack(
            self.config.pack, Path(tokens.path), out, store_ref=ref))


def _never(out: Path) -> dict[str, Any]:
    raise RuntimeError("stage output vanished between check and use")


def summary(results: dict[str, StageResult]) -> dict[str, Any]:
    """The one-line result of a run: where the token store and sample index are, and counts."""
    tokens = results["tokenize"]
    pack = results.get("pack")
    return {
        "token_store": tokens.path,
        "sample_index": pack.path if pack else None,
        "tokenizer": results["tokenizer"].path,
        "num_tokens": tokens.report["tokens"],
        "num_documents": tokens.report["documents"],
        "num_samples": pack.report["samples"] if pack else None,
        "stages": {name: {"key": r.key, "built": r.built, "seconds": r.report.get("seconds")} for name, r in results.items()},
    }


def text_and_tokenizer(p: Pipeline) -> dict[str, StageResult]:
    """convert → filter → save → tokenizer: what every way of tokenizing starts from."""
    results: dict[str, StageResult] = {}
    results["convert"] = p.convert(p.source_fingerprint())
    results["filter"] = p.filter(results["convert"])
    results["save"] = p.save(results["filter"])
    results["tokenizer"] = p.tokenizer(results["save"])
    return results


def prepare(config: PipelineConfig, plan: Plan | None = None, progress: bool = True) -> dict[str, Any]:
    """Run every data stage (no Prefect) and return `summary`."""
    p = Pipeline(config, plan=plan, progress=progress)
    results = text_and_tokenizer(p)
    results["tokenize"] = p.tokenize(results["save"], results["tokenizer"])
    if config.pack.enabled:
        results["pack"] = p.pack(results["tokenize"])
    return summary(results)


def merge(config: PipelineConfig, num_shards: int | None = None) -> dict[str, Any]:
    """Publish the token store from tokenize-shard units, then pack; return `summary`."""
    p = Pipeline(config, progress=False)
    results = text_and_tokenizer(p)
    results["tokenize"] = p.tokenize_merged(results["save"], results["tokenizer"], num_shards)
    if config.pack.enabled:
        results["pack"] = p.pack(results["tokenize"])
    return summary(results)


def launch_training(config: PipelineConfig, prepared: dict[str, Any], on_line: Callable[[str], None],
                    on_metrics: Callable[[dict], None] | None = None, plan: Plan | None = None) -> dict[str, Any]:
    """Train on prepared data with `accelerate launch python -m moai.train`; return the last metrics."""
    from moai import launch
    from moai.errors import DataError

    if config.train is None:
        raise DataError("no train section in the config: nothing to train")
    plan = plan or make_plan(detect(config.cache_dir, with_gpus=True), config, read_env())
    data = {k: prepared[k] for k in ("sample_index", "tokenizer", "token_store")}
    resolved = launch.resolve(config, data, plan.loader_workers.value)
    cmd = launch.launch_command(config.train, str(resolved), num_gpus=len(plan.hardware.gpus), port=launch.free_port(),
                                accelerate_config=str(resolved.parent / "accelerate.yaml"))
    log.info("launching %d training process(es): %s", cmd.num_processes, " ".join(cmd.argv))
    return launch.run_launch(cmd, on_line, on_metrics)
