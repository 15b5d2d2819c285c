"""tokenizer: load a Hugging Face fast tokenizer, or train a byte-level BPE from the saved text.

A loaded tokenizer must be fast (a `tokenizer.json` that the Rust `tokenizers` library runs) and
must have an EOS token, which ends every document in the token store. A missing PAD, or PAD
equal to EOS, is allowed but warned about: padded batches would then mask real EOS labels.

A trained tokenizer is a cached stage of its own, keyed on the saved text and its settings,
saved with `save_pretrained` so `AutoTokenizer.from_pretrained` opens it. With several sources
it is one tokenizer for all of them, trained on a sample of every source's saved train text in
proportion to the weights (by text bytes, `weighted_rows`): the weights are then among its
settings, so with `tokenizer.train` a changed weight retrains it (give `tokenizer.path` to tune
weights without re-tokenizing).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moai import hub
from moai.errors import TokenizerError
from moai.formats.text import open_text, text_batches

if TYPE_CHECKING:  # the tokenize workers import this module: they need neither pydantic nor the store
    from moai.config import PipelineConfig, TokenizerConfig, TokenizerTrainConfig

log = logging.getLogger(__name__)

NAME = "tokenizer"
VERSION = 1
COMBINES = True  # with several sources: one tokenizer, trained on all of them


def reads(config: PipelineConfig) -> tuple[str, ...]:
    """A given tokenizer chains from its files' fingerprint (the root `tokenizer-files`), not from
    the text; a trained one from the saved text."""
    return ("save",) if config.tokenizer.train is not None else ("tokenizer-files",)


def settings(config: PipelineConfig) -> dict[str, Any]:
    if config.tokenizer.train is None:
        return {}
    weights = {"weights": {s.name: s.weight for s in config.sources}} if config.sources is not None else {}
    return config.tokenizer.train.model_dump() | weights


def build(ctx, out: Path) -> dict[str, Any]:
    """A given tokenizer is checked once and copied into the store (so the token store's tokenizer
    cannot change under it); a trained one is trained once on the saved text."""
    tcfg = ctx.config.tokenizer
    if tcfg.train is None:
        return adopt_tokenizer(tcfg.path, out, trust_remote_code=tcfg.trust_remote_code)
    if ctx.config.sources is not None:
        saved = ctx.per_source("save")
        weights = {s.name: s.weight for s in ctx.config.sources}
        report = train_tokenizer_mixed(
            tcfg.train, {n: (saved[n], w) for n, w in weights.items()}, out, batch_size=ctx.plan.batch_size.value
        )
    else:
        report = train_tokenizer(tcfg.train, ctx.path("save"), out, batch_size=ctx.plan.batch_size.value)
    warnings = vocab_warnings(tcfg.train, report)
    for w in warnings:
        log.warning(w)
    return {**report, "warnings": warnings}


def vocab_warnings(cfg: TokenizerTrainConfig, report: dict[str, Any]) -> list[str]:
    """A vocabulary smaller than asked: BPE stops when no pair of tokens occurs min_frequency times."""
    got = report["vocab_size"]
    if got >= cfg.vocab_size:
        return []
    return [
        f"tokenizer.train.vocab_size {cfg.vocab_size:,} asked, {got:,} trained: the {report['documents']:,} "
        f"training documents have no more pairs of tokens occurring tokenizer.train.min_frequency "
        f"({cfg.min_frequency}) times or more to merge; train on more text (tokenizer.train.max_documents, more "
        "data), lower min_frequency, or ask for the vocabulary you got"
    ]


def info_of(config: PipelineConfig, published: Path | str, key: str) -> TokenizerInfo:
    """The `TokenizerInfo` of the tokenizer stage's output (what the tokenize workers need)."""
    tcfg = config.tokenizer
    trust = tcfg.trust_remote_code and tcfg.train is None
    info = describe_folder(str(published), tcfg.path or str(published), key, trust)
    return dataclasses.replace(info, trust_remote_code=trust)


def describe_folder(folder: str, name_or_path: str, fingerprint: str, trust_remote_code: bool = False) -> TokenizerInfo:
    """`describe` of the tokenizer in a local folder: from the reference process that loaded the
    same files ahead of time when there is one (`moai.stages.tokenize.reference`), else loaded here."""
    from moai.stages.tokenize import reference

    ref = None if trust_remote_code else reference.for_folder(folder)
    if ref is not None:
        return dataclasses.replace(ref.info(name_or_path, fingerprint), path=folder)
    return describe(loaded_tokenizer(folder, trust_remote_code), name_or_path, fingerprint, path=folder)


EOS = "<|endoftext|>"
PAD = "<|pad|>"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
# What `AutoTokenizer.from_pretrained` reads of a local folder (config.json: the model type, when
# tokenizer_config.json names no tokenizer class); adopting a tokenizer copies these.
ADOPTED_FILES = [
    *TOKENIZER_FILES,
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "chat_template.json",
    "chat_template.jinja",
    "config.json",
]


@dataclass(frozen=True)
class TokenizerInfo:
    """What the tokenize stage needs to know of a tokenizer; small and picklable."""

    name_or_path: str
    fingerprint: str
    # The Rust pipeline as transformers runs it on every call: its post-processor, and no
    # truncation or padding (a tokenizer.json saved after a call with truncation=True/padding=True
    # carries them; transformers switches both off per call, the raw backend would apply them).
    backend_json: str
    eos_id: int
    pad_id: int | None
    vocab_size: int
    warnings: list[str] = field(default_factory=list)
    split_special_tokens: bool = False  # tokenizer_config.json: special-token text is plain text
    path: str = ""  # the folder transformers loads it from (the reference ids come from there)
    trust_remote_code: bool = False  # how that folder must be loaded (tokenizer.trust_remote_code)


@functools.lru_cache(maxsize=2)
def _rust_tokenizer_file(path: str, mtime_ns: int, size: int):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.no_truncation()  # as transformers runs it
    tok.no_padding()
    return tok


def rust_tokenizer_file(file: Path):
    """`tokenizers.Tokenizer.from_file`, loaded once per file version for the checks before a run
    (the folder check and the bytes-per-token sample both need it; a 131k vocabulary takes ~1 s),
    without truncation or padding. Shared: encode with it, do not change it."""
    st = file.stat()
    return _rust_tokenizer_file(str(file), st.st_mtime_ns, st.st_size)


def drop_checked_tokenizers() -> None:
    """Forget what `rust_tokenizer_file` loaded."""
    loaded = _rust_tokenizer_file.cache_info().currsize
    _rust_tokenizer_file.cache_clear()
    if loaded:
        release_freed_memory()


def release_freed_memory() -> None:
    """Give the memory this process has freed back to the system (glibc's `malloc_trim`; nothing
    elsewhere). A tokenizer loaded in one thread and freed there stays in that thread's malloc
    arena, which the threads that build and run fastokens do not allocate from: after the
    preflight's check of a 131k vocabulary, a cold prepare of the 601 MB corpus peaked at
    737-755 MB with it kept, 620-648 MB with it given back (five runs each, alternated, the same
    time: 6.67-7.05 s against 6.49-7.07 s; 2026-11-27)."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator keeps what it keeps
        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: libc's where it is glibc


def check_folder(name_or_path: str, path: Path, load: bool = True) -> None:
    """A local tokenizer folder holds a tokenizer.json (that the Rust `tokenizers` library loads,
    with `load`): a `TokenizerError` naming the folder and the fix otherwise. Cheap (no transformers)."""
    if not path.is_dir():
        raise TokenizerError(f"tokenizer.path {name_or_path!r} is a file; give the folder that holds tokenizer.json")
    file = path / "tokenizer.json"
    if not file.is_file():
        present = sorted(p.name for p in path.iterdir())
        raise TokenizerError(
            f"tokenizer.path {name_or_path!r} has no tokenizer.json (files: {present}). moai needs a fast "
            "tokenizer: convert a slow one with AutoTokenizer.from_pretrained(path).save_pretrained(path) "
            "where `tokenizers` can convert it, or use tokenizer.train to train one."
        )
    if load:
        from moai.stages.tokenize.engines import file_build

        if file_build(file) is not None:
            return  # fastokens built it ahead, while transformers loads it (`reference.prefetch`)
        try:
            rust_tokenizer_file(file)
        except Exception as err:  # the Rust library's parse errors: a damaged or foreign file
            raise TokenizerError(
                f"tokenizer.path {name_or_path!r}: {file} cannot be loaded by `tokenizers` ({err}); "
                "give a folder saved by save_pretrained (or tokenizer.train to train one)"
            ) from None


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False):
    """Load a transformers fast tokenizer from a folder (or the hub) with clear errors; a missing
    folder or an unreachable hub name is a `ConfigError` within seconds (`moai.hub.resolve`)."""
    where = hub.resolve("tokenizer.path", name_or_path)
    if where.path is not None:
        check_folder(name_or_path, where.path, load=False)  # transformers loads it below
    if trust_remote_code:
        log.warning("tokenizer.trust_remote_code is on: loading %s may run code from it", name_or_path)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(
            where.name_or_path, trust_remote_code=trust_remote_code, local_files_only=where.local_files_only
        )
    except Exception as err:
        raise TokenizerError(
            f"cannot load tokenizer {name_or_path!r}: {type(err).__name__}: {err}. "
            "Give a local folder with tokenizer.json (offline machines cannot reach the hub)."
        ) from err
    if not getattr(tok, "is_fast", False):
        raise TokenizerError(
            f"tokenizer {name_or_path!r} is a slow (Python) tokenizer ({type(tok).__name__}); moai needs a fast one "
            "with tokenizer.json"
        )
    return tok


# One tokenizer loaded by transformers per process, by folder content: the tokenizer and tokenize
# stages load the same files (the build folder, then the published one) up to three times.
_loaded: dict[tuple[bool, str], Any] = {}


def store_files() -> set[str]:
    """The files the store writes beside a published tokenizer's own (not the tokenizer's content)."""
    from moai.store import MANIFEST, MANIFEST_DIGEST, USES

    return {MANIFEST, MANIFEST_DIGEST, USES}


def loaded_tokenizer(path: str, trust_remote_code: bool = False):
    """`load_tokenizer` of a local folder, reused while the folder's files are byte-identical
    (every file in it but the store's own; a hub name or a folder with subfolders: loaded each time).
    The object is shared: read it, do not change it."""
    from moai.store import fingerprint_files

    folder = Path(path).expanduser()
    if not folder.is_dir() or any(p.is_dir() for p in folder.iterdir()):
        return load_tokenizer(path, trust_remote_code)
    key = (trust_remote_code, fingerprint_files(sorted(p for p in folder.iterdir() if p.name not in store_files())))
    if key not in _loaded:
        _loaded.clear()
        _loaded[key] = load_tokenizer(path, trust_remote_code)
    return _loaded[key]


# The last backend pipeline written out (`backend_pipeline`): (the loaded tokenizer, its JSON text,
# a list that holds that text parsed once someone asked), replaced whole so a reader never mixes
# two. Writing out and parsing a 131k-vocabulary pipeline costs ~1 s each time, and one run needs
# it three times (the tokenizer stage, the tokenize stage, the tiktoken spec).
_backend: tuple[Any, str, list[dict[str, Any]]] = (None, "", [])


def backend_pipeline(tok) -> str:
    """The Rust pipeline of a loaded tokenizer as transformers runs it on every call, as JSON: its
    post-processor, and no truncation or padding (a tokenizer.json saved after a call with
    truncation=True/padding=True carries them; transformers switches both off per call, the raw
    backend would apply them). Made once per loaded tokenizer object (`loaded_tokenizer` shares
    them): the backend's own text when neither is set (no parse and rewrite: 0.9 s for a 131k
    vocabulary), else rewritten without them; `parsed_backend` parses it once, when first asked."""
    global _backend
    last = _backend
    if last[0] is tok:
        return last[1]
    rust = tok.backend_tokenizer
    text = rust.to_str()
    parsed: list[dict[str, Any]] = []
    if rust.truncation is not None or rust.padding is not None:
        backend = json.loads(text)
        backend["truncation"] = None
        backend["padding"] = None
        text = json.dumps(backend, ensure_ascii=False)
        parsed.append(backend)
    _backend = (tok, text, parsed)
    return text


def _made(backend_json: str) -> tuple[Any, str, list[dict[str, Any]]] | None:
    """The cached (tokenizer, text, [parsed] once parsed) when `backend_pipeline` made exactly this text."""
    last = _backend
    return last if backend_json is last[1] or backend_json == last[1] else None


def parsed_backend(backend_json: str) -> dict[str, Any]:
    """`json.loads(backend_json)`, parsed once for the text `backend_pipeline` made. Shared: read
    it, do not change it."""
    made = _made(backend_json)
    if made is None:
        return json.loads(backend_json)
    if not made[2]:
        made[2].append(json.loads(backend_json))
    return made[2][0]


def rust_backend(backend_json: str):
    """A `tokenizers.Tokenizer` that runs `backend_json`: the loaded tokenizer's own Rust object
    when `backend_pipeline` just made that text of it and it has no truncation or padding set
    (transformers unsets both after each call), else one parsed from the text (~0.6 s for 131k
    tokens). Shared: encode with it, do not change it."""
    from tokenizers import Tokenizer

    made = _made(backend_json)
    if made is not None:
        rust = made[0].backend_tokenizer
        if rust.truncation is None and rust.padding is None:
            return rust
    return Tokenizer.from_str(backend_json)


def describe(tok, name_or_path: str, fingerprint: str, path: str = "") -> TokenizerInfo:
    """Check EOS/PAD and capture the backend pipeline the workers will run, as transformers runs it."""
    if tok.eos_token_id is None:
        raise TokenizerError(
            f"tokenizer {name_or_path!r} has no EOS token; every document must end with one. "
            "Set eos_token in its tokenizer_config.json"
        )
    warnings = []
    if tok.pad_token_id is None:
        warnings.append(f"tokenizer {name_or_path!r} has no PAD token; unpacked (padded) training needs one")
    elif tok.pad_token_id == tok.eos_token_id:
        warnings.append(
            f"tokenizer {name_or_path!r}: PAD is EOS ({tok.eos_token!r}); "
            "masking padding would also mask real EOS labels"
        )
    for w in warnings:
        log.warning(w)
    return TokenizerInfo(
        name_or_path=name_or_path,
        fingerprint=fingerprint,
        backend_json=backend_pipeline(tok),
        eos_id=int(tok.eos_token_id),
        pad_id=None if tok.pad_token_id is None else int(tok.pad_token_id),
        vocab_size=len(tok),
        warnings=warnings,
        split_special_tokens=bool(getattr(tok, "split_special_tokens", False)),
        path=path or name_or_path,
    )


def tokenizer_fingerprint(cfg: TokenizerConfig) -> str:
    """Fingerprint of a given tokenizer: its files' content (a hub name: its resolved files)."""
    from moai.store import fingerprint_dir

    assert cfg.path is not None, "a given tokenizer (tokenizer.path) has files to fingerprint; a trained one has none"
    path = Path(cfg.path).expanduser()
    if path.is_dir():
        return "dir:" + fingerprint_dir(path, [*TOKENIZER_FILES, "vocab.json", "merges.txt", "tokenizer.model"])
    tok = load_tokenizer(cfg.path, cfg.trust_remote_code)
    return "hub:" + cfg.path + ":" + hashlib.sha256(tok.backend_tokenizer.to_str().encode()).hexdigest()[:32]


def adopt_tokenizer(name_or_path: str, out_dir: Path, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """Check a given tokenizer (fast, EOS, PAD) and save a copy of it in `out_dir`.

    A local folder (without remote code) is copied file by file (`ADOPTED_FILES`) and checked as
    loaded from the copy: no `save_pretrained`, and the tokenize stage then reuses that load
    (`loaded_tokenizer`: same files). A hub name or remote code: loaded, then `save_pretrained`."""
    started = time.perf_counter()
    source = Path(name_or_path).expanduser()
    if source.is_dir() and not trust_remote_code and (source / "tokenizer.json").is_file():
        for name in ADOPTED_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, out_dir / name)
        info = describe_folder(str(out_dir), name_or_path, "")
    else:
        tok = load_tokenizer(name_or_path, trust_remote_code)
        info = describe(tok, name_or_path, "")
        tok.save_pretrained(str(out_dir))
    return {
        "source": name_or_path,
        "vocab_size": info.vocab_size,
        "eos_id": info.eos_id,
        "pad_id": info.pad_id,
        "warnings": info.warnings,
        "seconds": round(time.perf_counter() - started, 3),
    }


def build_bpe(texts, vocab_size: int, min_frequency: int = 2, length: int | None = None):
    """Train a byte-level BPE (GPT-2 style split, EOS and PAD specials) on an iterator of text batches.

    The Rust trainer runs in a daemon thread that this one waits on in 0.2 s slices. Called from
    the main thread, it would hold it until training ends (the merges never return to Python), so
    Ctrl-C or SIGTERM waited for it (measured: ~14 s on 100 MB of text); waiting in slices, the
    signal handler runs at once. It needs no copy of the text and no second interpreter (as a child
    process would): the trainer releases the GIL, and only reads the text batches through it. On
    an interrupt the thread is left running, in memory only, until the process exits."""
    from transformers import PreTrainedTokenizerFast

    tok = train_bpe(texts, vocab_size, min_frequency, length)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=None, unk_token=None)


def train_bpe(texts, vocab_size: int, min_frequency: int = 2, length: int | None = None):
    """`build_bpe`'s `tokenizers.Tokenizer` itself, without transformers (the plan measures a
    trained tokenizer's bytes per token with one trained on a sample)."""
    import threading

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    failed: list[BaseException] = []

    def run() -> None:
        try:
            tok.train_from_iterator(texts, trainer=trainer, length=length)
        except BaseException as err:  # handed to the waiting thread, raised there
            failed.append(err)

    worker = threading.Thread(target=run, name="moai-bpe-trainer", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
    if failed:
        raise failed[0]
    return tok


def train_tokenizer(
    cfg: TokenizerTrainConfig, text_dir: Path, out_dir: Path, *, batch_size: int = 1000
) -> dict[str, Any]:
    """Train a byte-level BPE of `vocab_size` on the train split and save it in Hugging Face format."""
    started = time.perf_counter()
    table = open_text(text_dir)["train"].data.table
    limit = min(table.num_rows, cfg.max_documents or table.num_rows)
    texts = (batch.column(0).to_pylist() for batch in text_batches(table, batch_size, 0, limit))
    fast = build_bpe(texts, cfg.vocab_size, cfg.min_frequency, length=limit)
    fast.save_pretrained(str(out_dir))
    return {
        "documents": limit,
        "vocab_size": len(fast),
        "seconds": round(time.perf_counter() - started, 3),
    }


def weighted_rows(sizes: dict[str, Any], weights: dict[str, float], max_documents: int | None) -> dict[str, int]:
    """How many of each source's first documents to train on (`sizes`: each document's text bytes):
    text bytes in proportion to the weights, as many as the scarcest source allows, at most
    `max_documents` in all, at least one document a source."""
    import numpy as np

    total_w = sum(weights.values())
    ends = {n: np.cumsum(np.asarray(sizes[n], dtype=np.int64)) for n in weights}
    budget = min(float(ends[n][-1]) / (w / total_w) if len(ends[n]) else 0.0 for n, w in weights.items())
    take = {}
    for n, w in weights.items():
        rows = int(np.searchsorted(ends[n], budget * w / total_w * (1 - 1e-12), side="left")) + 1
        take[n] = max(1, min(rows, len(ends[n])))
    if max_documents is not None and sum(take.values()) > max_documents:
        scale = max_documents / sum(take.values())
        take = {n: max(1, int(k * scale)) for n, k in take.items()}
    return take


def train_tokenizer_mixed(
    cfg: TokenizerTrainConfig, saved: dict[str, tuple[Path, float]], out_dir: Path, *, batch_size: int = 1000
) -> dict[str, Any]:
    """One byte-level BPE over several sources' saved text, sampled by `weighted_rows`."""
    import pyarrow.compute as pc

    started = time.perf_counter()
    tables = {n: open_text(path)["train"].data.table for n, (path, _) in saved.items()}
    sizes = {n: pc.binary_length(t.column(0).cast("binary")).fill_null(0).to_numpy() for n, t in tables.items()}
    take = weighted_rows(sizes, {n: w for n, (_, w) in saved.items()}, cfg.max_documents)

    def texts():
        for n, table in tables.items():
            for batch in text_batches(table, batch_size, 0, take[n]):
                yield batch.column(0).to_pylist()

    fast = build_bpe(texts(), cfg.vocab_size, cfg.min_frequency, length=sum(take.values()))
    fast.save_pretrained(str(out_dir))
    return {
        "documents": sum(take.values()),
        "documents_by_source": take,
        "vocab_size": len(fast),
        "seconds": round(time.perf_counter() - started, 3),
    }
