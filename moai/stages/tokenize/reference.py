"""transformers' side of the check, in a process of its own, started before the stages that need it.

A cold run pays 3–9 s to import transformers (it imports torch) and load a large tokenizer before
it can compare a single id, and none of that depends on the text. `prefetch(config)` starts a
spawned process that loads the given tokenizer folder while convert, filter and save run on the
other cores. The tokenizer stage then takes the tokenizer's description from it (`describe`), and
the tokenize stage transformers' own ids of its sample (`ids`): the check is the same check, only
the process transformers runs in changed, and nothing is published before the ids match.

The process loads the folder it was given and is used only for a folder whose files are
byte-identical to those (the tokenizer stage's copy is): anything else, a hub name, remote code or
chat data, loads in the stage's own process as before. The process ends with the run (`close`) or
with this process (daemon).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moai.errors import TokenizerError
from moai.stages.tokenize import engines
from moai.workers import interrupts_left_to_parent

if TYPE_CHECKING:
    from moai.config import PipelineConfig
    from moai.stages.tokenizer import TokenizerInfo

log = logging.getLogger("moai.stages.tokenize")


def _files_fingerprint(folder: Path) -> str:
    from moai.stages.tokenizer import store_files
    from moai.store import fingerprint_files

    skip = store_files()
    return fingerprint_files(sorted(p for p in folder.iterdir() if p.is_file() and p.name not in skip))


def _serve(conn, folder: str) -> None:
    """The reference process: load the tokenizer, send its description, then answer id requests."""
    logging.getLogger("moai").addHandler(logging.NullHandler())  # the parent logs what matters
    try:
        from moai.stages.tokenizer import describe, load_tokenizer

        tok = load_tokenizer(folder)
        conn.send(("info", describe(tok, folder, "", path=folder)))
    except BaseException as err:  # sent to the parent, which raises it where the stage needs it
        conn.send(("error", f"{type(err).__name__}: {err}" if not isinstance(err, TokenizerError) else str(err)))
        return
    while True:
        try:
            texts = conn.recv()
        except EOFError:
            return
        if texts is None:
            return
        conn.send(("ids", tok(texts, verbose=False)["input_ids"] if texts else []))


class Reference:
    """A tokenizer folder loaded by transformers in another process."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.fingerprint = _files_fingerprint(folder)
        ctx = get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, str(folder)), daemon=True, name="moai-reference")
        with interrupts_left_to_parent():  # Ctrl-C: one line from the parent, which kills this process
            self.process.start()
        child.close()
        self._info: Any = None
        self._lock = threading.Lock()  # one request on the pipe at a time (the prebuild thread asks too)

    def _recv(self) -> Any:
        try:
            kind, value = self.conn.recv()
        except EOFError:
            raise TokenizerError(
                f"the process loading tokenizer {str(self.folder)!r} with transformers ended without an answer "
                f"(exit code {self.process.exitcode})"
            ) from None
        if kind == "error":
            raise TokenizerError(value)
        return value

    def info(self, name_or_path: str, fingerprint: str = "") -> TokenizerInfo:
        """`describe` of the loaded tokenizer, as this folder's (warnings logged here)."""
        import dataclasses

        with self._lock:
            if self._info is None:
                try:
                    self._info = self._recv()
                except TokenizerError as err:
                    self._info = err  # every later caller gets the same error
                if not isinstance(self._info, TokenizerError):
                    for w in self._info.warnings:
                        log.warning(w)
            if isinstance(self._info, TokenizerError):
                raise TokenizerError(str(self._info))
        return dataclasses.replace(self._info, name_or_path=name_or_path, fingerprint=fingerprint)

    def ids(self, texts: list[str]) -> list[list[int]]:
        """`tokenizer(texts)["input_ids"]`, computed by transformers in the reference process."""
        self.info(str(self.folder))
        with self._lock:
            self.conn.send(texts)
            return self._recv()

    def close(self) -> None:
        """End the process now: it holds nothing to save, and a clean exit of transformers and torch
        takes ~1 s that a finished run would wait for."""
        self.process.kill()
        self.process.join()
        self.conn.close()


_running: list[Reference] = []


def for_folder(folder: str | Path) -> Reference | None:
    """The running reference process whose folder's files are byte-identical to `folder`'s, if any."""
    if not _running:
        return None
    path = Path(folder)
    if not path.is_dir():
        return None
    fp = _files_fingerprint(path)
    return next((r for r in _running if r.fingerprint == fp and r.process.is_alive()), None)


def _wanted(config: PipelineConfig) -> Path | None:
    """The local tokenizer folder a cold run of `config` will load with transformers, if it may be
    loaded ahead (no remote code, no chat template rendering in the process)."""
    tcfg = config.tokenizer
    if tcfg.path is None or tcfg.trust_remote_code:
        return None
    sources: list[Any] = [config.source, *(config.sources or [])]
    if any(s is not None and s.format == "chat" for s in sources):
        return None
    folder = Path(tcfg.path).expanduser()
    if not (folder / "tokenizer.json").is_file() or any(p.is_dir() for p in folder.iterdir()):
        return None
    return folder


@contextlib.contextmanager
def prefetch(config: PipelineConfig) -> Iterator[Reference | None]:
    """Load the config's tokenizer with transformers in another process for the length of the block."""
    folder = _wanted(config)
    if folder is None:
        yield None
        return
    ref = Reference(folder)
    _running.append(ref)
    # Then the fastest engine is built from the pipeline transformers runs, also before it is needed
    # (parsing a 131k vocabulary takes fastokens ~1.3 CPU s); the check still decides whether it is used.
    threading.Thread(target=_prebuild, args=(ref,), daemon=True, name="moai-prebuild").start()
    try:
        yield ref
    finally:
        _running.remove(ref)
        ref.close()
        engines.drop_prebuilt()


def _prebuild(ref: Reference) -> None:
    with contextlib.suppress(Exception):  # whatever fails here fails again, reported, in the check
        info = ref.info(str(ref.folder))
        engines.prebuild(info.backend_json, info.split_special_tokens)
