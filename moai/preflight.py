"""Checks before anything runs: what can be decided from the config and the machine in seconds.

`moai plan` prints them, `moai doctor CONFIG` shows them as rows, and `moai prepare`, `moai train`
and the flow call `require` before the first stage, so a mistake found here costs seconds rather
than a data preparation and a launch:

- the source: `source.path` matches files, or `source.hub` is a dataset that can be had (with
  `sources:`, each source, checked as `sources.<name>`);
- `tokenizer.path`, `train.model_config` (a path or hub name) and `train.init_from`: an existing
  path, or a hub name in the local cache or on a reachable hub (`moai.hub.resolve`); a tokenizer
  folder holds a `tokenizer.json` that the Rust `tokenizers` library loads;
- `cache_dir` can be written (a probe file is created and removed);
- free space on cache_dir's filesystem against the corpus: convert holds the text twice while
  it runs (source read, Arrow written), and the whole cache ends near 3× the text;
- `pack.seq_len` is at most the model's `max_position_embeddings`;
- the validation split is estimated from a tokenized sample of each local source
  (`moai.estimate`, saying when it is rough and why): a split shorter than one `seq_len` window
  packs to 0 samples and training evaluates nothing;
- `train.output_dir` can be resumed with these settings, or is already finished
  (`moai.train.checkpoint.resume_plan`);
- `runner.kind ray`: Ray and prefect-ray are installed (`pip install 'moai[ray]'`);
- `train.tracker` mlflow or wandb: its library is installed (`pip install 'moai[track]'`).

`gather` reads the facts (side effects live there), `evaluate` turns them into checks (pure).
Independent failures are raised together (`Mistakes`), one line each.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moai.config import PipelineConfig, SourceConfig
from moai.errors import ConfigError, DataError, MoaiError
from moai.estimate import Estimate, SourceSample, sample_limit, sample_source, validation

log = logging.getLogger(__name__)

BYTES_PER_TOKEN = 4  # a byte-level BPE on English and code: ~4 bytes a token (fewer on small vocabularies)
CONVERT_FACTOR = 2  # convert: the source and the Arrow text side by side
CACHE_FACTOR = 3  # every stage of the cache: text, filtered text, saved text, tokens, index


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | warn | fail
    detail: str
    fix: str = ""
    error: MoaiError | None = field(default=None, compare=False, repr=False)  # what a fail raises


@dataclass
class Facts:
    """What the checks need to know, read by `gather`."""

    config: PipelineConfig
    resolved: dict[str, str] = field(default_factory=dict)  # setting → where it was found
    errors: dict[str, MoaiError] = field(default_factory=dict)  # setting → why it cannot be used
    corpus_bytes: int | None = None  # local source files' text, summed (compressed ones estimated)
    num_files: int = 0
    local_files: dict[str, tuple[int, int]] = field(default_factory=dict)  # source setting → (files, bytes)
    mix_budget: tuple[int | None, str] | None = None  # with sources: the mix's tokens and where they come from
    cache_dir: str = ""
    cache_write_error: str | None = None
    free_gb: float | None = None
    cache_has_entries: bool = False  # something is already built: a rerun may need little space
    train_checked: bool = False  # the train section was read (model config, resume)
    model_setting: str = ""
    model_config: dict[str, Any] | None = None
    resume: Check | None = None
    tracker: Check | None = None
    cleaning: dict[str, str] = field(default_factory=dict)  # cleaning stage that is on → what it will do
    runner_missing: list[str] = field(default_factory=list)  # packages runner.kind needs that are not installed
    samples: dict[str, SourceSample | str] = field(default_factory=dict)  # source setting -> its first rows, or why not


def gather(config: PipelineConfig, *, tokenizer: bool = True, train: bool = True, resume: bool = True) -> Facts:
    """Read the facts (paths, hub names, cache_dir, free space, the model config); `tokenizer=False`
    leaves tokenizer.path to a caller that loads it anyway (`moai doctor`), `train=False` leaves
    the train section out (`moai prepare` does not train)."""
    from moai import hub
    from moai.hardware import detect
    from moai.stages.convert.compressed import text_bytes
    from moai.stages.convert.readers import source_files

    f = Facts(config=config, cache_dir=str(Path(config.cache_dir).expanduser().resolve()))
    for setting, src in source_settings(config):
        try:
            if src.hub is not None:
                f.resolved[setting] = hub.resolve(f"{setting}.hub", src.hub, "dataset").where
            else:
                files = source_files(src)
                f.local_files[setting] = (len(files), text_bytes(files))
        except MoaiError as err:
            f.errors[setting] = err if setting == "source" else type(err)(f"{setting}: {err}")
    _cleaning_into(f)
    if config.sources is not None:
        from moai.stages.mix import budget

        f.mix_budget = budget(config)
    if f.local_files:
        f.num_files = sum(n for n, _ in f.local_files.values())
        f.corpus_bytes = sum(b for _, b in f.local_files.values())
    if tokenizer and config.tokenizer.path is not None:
        _resolve_into(f, "tokenizer.path", config.tokenizer.path)
    _samples_into(f)
    from moai.stages.tokenizer import drop_checked_tokenizers

    drop_checked_tokenizers()  # ~230 MB for a 131k vocabulary, not needed past the checks
    t = config.train
    if train and t is not None and t.enabled:
        f.train_checked = True
        from moai.train.model import model_config_dict

        try:
            f.model_setting, f.model_config = model_config_dict(t)
        except MoaiError as err:
            f.errors["train.init_from" if t.mode == "continue" else "train.model_config"] = err
        f.resume = _resume_check(config) if resume else None
        f.tracker = _tracker_check(t.tracker)
    f.cache_write_error = _write_probe(Path(f.cache_dir))
    f.runner_missing = [d for m, d in RUNNER_PACKAGES.get(config.runner.kind, {}).items() if not _installed(m)]
    f.free_gb = detect(f.cache_dir, with_gpus=False).disk_free_gb
    convert_dir = Path(f.cache_dir) / "convert"
    f.cache_has_entries = convert_dir.is_dir() and any(convert_dir.glob("*/_manifest.json"))
    return f


def source_settings(config: PipelineConfig) -> list[tuple[str, SourceConfig]]:
    """Each source with the setting that names it: `source`, or `sources.<name>` for each of several."""
    if config.sources is None:
        assert config.source is not None
        return [("source", config.source)]
    return [(f"sources.{s.name}", s.source()) for s in config.sources]


def _cleaning_into(f: Facts) -> None:
    """Each cleaning stage that is on, with its settings resolved as its key will be (an unknown
    quality rule, a missing decontaminate.path): failures now, not after convert and filter ran."""
    from moai import pipeline
    from moai.sources import source_config, source_names
    from moai.stages import chain

    names = source_names(f.config)
    one = f.config if names is None else source_config(f.config, names[0])
    for name, is_on in chain.CHAIN[1:]:
        if not is_on(one):
            continue
        try:
            f.cleaning[name] = _cleaning_detail(f, name, pipeline.stage(name).settings(one))
        except MoaiError as err:
            f.errors[name] = err


def _cleaning_detail(f: Facts, name: str, settings: dict[str, Any]) -> str:
    if name == "dedup":
        near = settings.get("near")
        parts = ["exact copies"] if settings.get("exact") else []
        if near:
            from moai.stages.signatures import hasher

            mh = hasher(f.config.dedup) if f.config.dedup is not None else None
            lsh = f", {mh.bands} bands × {mh.rows} rows" if mh is not None else ""
            parts.append(f"near copies at Jaccard ≥ {near['threshold']} (MinHash {near['num_perm']}{lsh})")
        return " and ".join(parts)
    if name == "quality":
        return f"{len(settings['rules'])} rules; code documents: {settings['code']}"
    if name == "language":
        return f"keep {', '.join(settings['keep'])} at score ≥ {settings['min_score']}"
    return f"{settings['ngram']}-grams of the evaluation texts in field(s) {settings['text_field']}"


def _samples_into(f: Facts) -> None:
    """Each local source's first rows as tokenize will count them (`moai.estimate.sample_source`),
    with a local tokenizer folder or a tokenizer to train."""
    from moai.stages.convert.readers import source_files

    path = f.config.tokenizer.path
    if path is not None and (
        "tokenizer.path" in f.errors or not (Path(path).expanduser() / "tokenizer.json").is_file()
    ):
        return
    for setting, src in source_settings(f.config):
        if setting not in f.local_files or f.local_files[setting][1] == 0:
            continue
        try:
            limit = sample_limit(f.local_files[setting][1], f.config)
            f.samples[setting] = sample_source(source_files(src), src, f.config, limit)
        except Exception as err:  # an estimate only: the bytes-based one then
            log.debug("%s: no sample for the validation estimate", setting, exc_info=True)
            f.samples[setting] = f"its sample could not be read ({type(err).__name__})"


def _resolve_into(f: Facts, setting: str, value: str) -> None:
    from moai import hub

    try:
        resolved = hub.resolve(setting, value)
        if setting == "tokenizer.path" and resolved.path is not None:
            from moai.stages.tokenizer import check_folder

            check_folder(value, resolved.path)  # tokenizer.json there and loadable: before any stage
        f.resolved[setting] = resolved.where
    except MoaiError as err:
        f.errors[setting] = err


def _write_probe(cache_dir: Path) -> str | None:
    """Create and remove a file in cache_dir (or in the nearest folder that exists, where cache_dir
    would be created); the error text when that fails."""
    folder = cache_dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    probe = folder / f".moai-write-probe-{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as err:
        return f"{type(err).__name__}: {err.strerror or err}"
    return None


def _resume_check(config: PipelineConfig) -> Check | None:
    """What training will do in train.output_dir (`checkpoint.resume_plan`: reads only the newest
    checkpoint's state.json): fail when it was made with other settings, warn when it is finished."""
    from moai.train import checkpoint

    resume_plan = getattr(checkpoint, "resume_plan", None)  # None: a moai without that decision
    if resume_plan is None:
        return None
    try:
        decided = resume_plan(config)
    except MoaiError as err:
        return Check("train.output_dir", "fail", str(err), error=err)
    if decided.status == "finished":
        return Check("train.output_dir", "warn", decided.detail)  # the detail says how to train further
    return Check("train.output_dir", "pass", decided.detail)


def _tracker_check(kind: str) -> Check | None:
    from moai.train.tracking import tracker_error

    if kind == "none":
        return None
    if (err := tracker_error(kind)) is not None:
        return Check("train.tracker", "fail", str(err), "pip install 'moai[track]'", error=err)
    return Check("train.tracker", "pass", f"{kind} installed; a step reaches it once its checkpoint is written")


def evaluate(f: Facts) -> list[Check]:
    """The checks for a set of facts (pure)."""
    c = f.config
    out: list[Check] = []
    out.extend(_setting_check(f, setting, _source_detail(f, setting, src)) for setting, src in source_settings(c))
    if f.mix_budget is not None:
        total, why = f.mix_budget
        detail = f"{total:,} tokens ({why})" if total is not None else why
        out.append(Check("mix.total_tokens", "pass", detail + "; each source's share is checked when mix runs"))
    if "tokenizer.path" in f.resolved or "tokenizer.path" in f.errors:
        out.append(_setting_check(f, "tokenizer.path", f"{c.tokenizer.path} ({f.resolved.get('tokenizer.path')})"))
    if f.train_checked and c.train is not None:
        setting = "train.init_from" if c.train.mode == "continue" else "train.model_config"
        out.append(_setting_check(f, setting, f.model_setting and _model_detail(f)))
    for name in ("dedup", "quality", "language", "decontaminate"):
        if name in f.cleaning or name in f.errors:
            out.append(_setting_check(f, name, f.cleaning.get(name, "")))
    if c.runner.kind != "local":
        out.append(_runner_check(f))
    out.append(_cache_dir_check(f))
    out.extend(_space_checks(f))
    out.extend(_seq_len_checks(f))
    if f.resume is not None:
        out.append(f.resume)
    if f.tracker is not None:
        out.append(f.tracker)
    return out


def _setting_check(f: Facts, name: str, detail: str) -> Check:
    err = f.errors.get(name)
    if err is None and f.local_files.get(name, (0, 1))[1] == 0:
        # Decided from the file sizes: convert would only find out after reading, and say the same.
        num_files, path = f.local_files[name][0], dict(source_settings(f.config))[name].path
        what = "is empty (0 bytes)" if num_files == 1 else f"matches {num_files} files, all empty (0 bytes)"
        err = DataError(f"{name}.path {path} {what}: there is nothing to convert; check {name}.path")
    if err is not None:
        return Check(name, "fail", str(err), error=err)
    return Check(name, "pass", detail)


def _source_detail(f: Facts, setting: str, src: SourceConfig) -> str:
    if src.hub is not None:
        where = {"cache": "in the local Hugging Face cache", "hub": "on huggingface.co"}.get(
            f.resolved.get(setting, "")
        )
        return f"hub dataset {src.hub} {where or 'found'}"
    num_files, size = f.local_files.get(setting, (0, 0))
    return f"{src.path}: {num_files} file(s), {_gb(size)}"


def _model_detail(f: Facts) -> str:
    if f.model_config is None:
        return f"{f.model_setting}: a hub name whose config.json is not cached here (checked when training loads it)"
    mpe = f.model_config.get("max_position_embeddings")
    kind = f.model_config.get("model_type", "?")
    return f"{kind} model, max_position_embeddings {mpe if mpe is not None else 'not given (the default of its type)'}"


# the optional packages a runner.kind imports (module → distribution); Dask's come with moai
RUNNER_PACKAGES = {"ray": {"ray": "ray", "prefect_ray": "prefect-ray"}}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None  # finds it without importing it


def _runner_check(f: Facts) -> Check:
    r = f.config.runner
    if f.runner_missing:
        fix = f"pip install 'moai[{r.kind}]'"
        err = ConfigError(
            f"runner.kind {r.kind} needs {' and '.join(f.runner_missing)}, not installed here: {fix} "
            "(or runner.kind local)"
        )
        return Check("runner", "fail", str(err), fix, error=err)
    where = f"the cluster at {r.address}" if r.address else "a local cluster on loopback"
    return Check("runner", "pass", f"{r.kind}: the tokenize and dedup signature units run on {where}")


def _cache_dir_check(f: Facts) -> Check:
    if f.cache_write_error is None:
        return Check("cache_dir", "pass", f"{f.cache_dir} is writable")
    fix = f"set cache_dir to a folder you can write, or make {f.cache_dir} writable (chmod u+w / chown)"
    err = ConfigError(f"cache_dir {f.cache_dir} is not writable ({f.cache_write_error}); {fix}")
    return Check("cache_dir", "fail", str(err), fix, error=err)


def _space_checks(f: Facts) -> list[Check]:
    if f.corpus_bytes is None or f.free_gb is None:
        return []
    corpus, need_run, need_all = f.corpus_bytes, CONVERT_FACTOR * f.corpus_bytes, CACHE_FACTOR * f.corpus_bytes
    have = f"{f.free_gb:.2f} GB free on cache_dir {f.cache_dir}"
    fix = "free disk space or set cache_dir to a bigger disk"
    if f.free_gb * 1e9 < need_run and not f.cache_has_entries:
        err = ConfigError(
            f"{have}, but convert needs ~{_gb(need_run)} ({CONVERT_FACTOR}× the {_gb(corpus)} source) "
            f"while it runs and the cache ~{_gb(need_all)} in all; {fix}"
        )
        return [Check("space for data", "fail", str(err), fix, error=err)]
    if f.free_gb * 1e9 < need_all:
        detail = f"{have}; the cache takes ~{_gb(need_all)} in all ({CACHE_FACTOR}× the {_gb(corpus)} source)"
        return [Check("space for data", "warn", detail, fix)]
    return [Check("space for data", "pass", f"{have}; ~{_gb(need_all)} needed ({CACHE_FACTOR}× the source)")]


def _seq_len_checks(f: Facts) -> list[Check]:
    c = f.config
    out: list[Check] = []
    seq_len = c.pack.seq_len
    mpe = (f.model_config or {}).get("max_position_embeddings")
    if f.train_checked and isinstance(mpe, int):
        if seq_len > mpe:
            fix = f"lower pack.seq_len to at most {mpe}, or raise max_position_embeddings in {f.model_setting}"
            err = ConfigError(
                f"pack.seq_len {seq_len} is above the model's max_position_embeddings {mpe} ({f.model_setting}); {fix}"
            )
            out.append(Check("pack.seq_len", "fail", str(err), fix, error=err))
        else:
            out.append(Check("pack.seq_len", "pass", f"{seq_len} ≤ max_position_embeddings {mpe}"))
    if c.pack.enabled:
        out.extend(_validation_checks(f))
    return out


def _validation_checks(f: Facts) -> list[Check]:
    """The validation split expected: each source's own (a mix keeps them apart), summed."""
    c, seq_len = f.config, f.config.pack.seq_len
    hub = [setting for setting, src in source_settings(c) if src.hub is not None]
    if c.split.val_fraction == 0:
        return []
    if hub:
        return [
            Check("validation", "pass", f"not estimated: {hub[0]} is a hub dataset, its size is known after convert")
        ]
    if not f.corpus_bytes:
        return []
    parts = []
    for setting, size in ({s: size for s, (_, size) in f.local_files.items()} or {"": f.corpus_bytes}).items():
        sample = f.samples.get(setting, "no tokenizer to count with before prepare")
        if isinstance(sample, SourceSample):
            parts.append(validation(sample, size, c))
            continue
        tokens, samples = validation_estimate(size, c.split.val_fraction, seq_len) or (0, 0)
        why = f"{setting or 'the source'} not sampled ({sample}): ~{BYTES_PER_TOKEN} bytes a token assumed"
        parts.append(Estimate(tokens, samples, 0, (why,)))
    tokens, samples = sum(p.tokens for p in parts), sum(p.samples for p in parts)
    rows = sum(p.rows for p in parts)
    rough = list(dict.fromkeys(r for p in parts for r in p.rough))
    sampled = [s for s in f.samples.values() if isinstance(s, SourceSample)]
    if c.dedup is not None and len(parts) > 1:
        rough.append("dedup drops copies of earlier sources' rows that each source's sample does not see")
    cleaned = _cleaned(sampled)
    rates = sorted({round(s.bytes_per_token, 1) for s in sampled})
    how = "a BPE trained on a sample" if any(s.trained for s in sampled) else "the tokenizer on a sample"
    rate = f"~{'/'.join(f'{r:.1f}' for r in rates)} bytes a token, measured with {how}" if rates else ""
    about = ", ".join(x for x in (f"~{rows} rows" if rows else "", cleaned, rate) if x)
    note = f"; rough: {'; '.join(rough)}" if rough else ""
    if samples < 1:
        detail = (
            f"~{tokens} validation tokens (split.val_fraction {c.split.val_fraction} of {_gb(f.corpus_bytes)}"
            f"{', ' + about if about else ''}) < pack.seq_len {seq_len}: likely 0 validation samples, and training "
            f"then evaluates nothing{note}"
        )
        return [Check("validation", "warn", detail, "lower pack.seq_len, raise split.val_fraction, or add data")]
    detail = f"~{samples} validation sample(s) of {seq_len} tokens{f' ({about})' if about else ''}{note}"
    return [Check("validation", "pass", detail)]


def _cleaned(sampled: list[SourceSample]) -> str:
    """What the cleaning stages drop of the sampled rows, e.g. `cleaning drops 224 of 400 sampled rows`."""
    dropped = sum(n for s in sampled for n in s.dropped.values())
    if not any(s.dropped for s in sampled):
        return ""
    return f"cleaning drops {dropped} of {dropped + sum(len(s.lengths) for s in sampled)} sampled rows"


def validation_estimate(
    corpus_bytes: int | None, val_fraction: float, seq_len: int, bytes_per_token: float = BYTES_PER_TOKEN
) -> tuple[int, int] | None:
    """(tokens, samples) the validation split will roughly hold; None when it cannot be told (a
    hub dataset) or is meant to be empty (val_fraction 0)."""
    if corpus_bytes is None or val_fraction == 0:
        return None
    tokens = int(corpus_bytes * val_fraction / bytes_per_token)
    return tokens, tokens // seq_len


def _gb(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:.1f} MB" if num_bytes < 1e9 else f"{num_bytes / 1e9:.2f} GB"


def run(config: PipelineConfig, *, tokenizer: bool = True, train: bool = True, resume: bool = True) -> list[Check]:
    return evaluate(gather(config, tokenizer=tokenizer, train=train, resume=resume))


def require(config: PipelineConfig, *, train: bool = True, resume: bool = True) -> list[Check]:
    """The checks, before any stage runs: warnings logged, the first failure raised as its error.
    `resume=False` (`moai prepare`): the model config is checked against the data settings, but
    train.output_dir is not: preparing data does not train."""
    checks = run(config, train=train, resume=resume)
    first_failure(checks)  # before the warnings: a mistake is the one line a user reads
    for c in checks:
        if c.status == "warn":
            log.warning("%s: %s%s", c.name, c.detail, f"; {c.fix}" if c.fix else "")
    return checks


def first_failure(checks: list[Check]) -> None:
    """Raise the failed check's error (a `ConfigError` of its text when it carries none); several
    independent failures together, one line each, so one attempt shows every mistake it can."""
    failed = [
        c.error if c.error is not None else ConfigError(f"{c.name}: {c.detail}") for c in checks if c.status == "fail"
    ]
    if len(failed) == 1:
        raise failed[0]
    if failed:
        raise Mistakes(failed)


class Mistakes(ConfigError):
    """Several independent mistakes found by the checks: one line each (the CLI prefixes every line)."""

    def __init__(self, errors: list[MoaiError]):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors
