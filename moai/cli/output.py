"""What the terminal shows besides a command's own output: the log handler (terse `moai: warning:`
lines, INFO only with -v), the stage table, progress bars off, and one line for a fault of the
machine (permissions, a full disk) instead of a traceback."""

from __future__ import annotations

import logging
import os
import sys


class _Terse(logging.Formatter):
    """Without -v: a warning is `moai: warning: ...`, like the errors (no time, no logger name)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"moai: {record.levelname.lower()}: {record.getMessage()}"


def _set_up_logging(verbose: bool) -> None:
    """The stage table and warnings on stderr; the library's INFO records (what was published,
    reused, which engine) only with -v, with their time and logger."""
    handler = logging.StreamHandler(sys.stderr)
    if verbose:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(_Terse())
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, handlers=[handler])


def _print_stages(result: dict) -> None:
    """The per-stage summary on stderr: built or reused, rows in → out, dropped by reason, seconds."""
    from moai.report import stage_table

    stages = result.get("stages", {})
    for line in stage_table(stages):
        print(f"moai: {line}", file=sys.stderr, flush=True)
    # A stage built now logged its warnings as it ran; a reused one says them again, every command.
    for s in stages.values():
        if not s.get("built"):
            for warning in s.get("warnings") or []:
                print(f"moai: warning: {warning}", file=sys.stderr, flush=True)


def _quiet_progress() -> None:
    """--no-progress: no bars from datasets, transformers or the hub, here and in the training
    processes (they inherit the environment)."""
    import os

    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()


def environment_error(err: OSError) -> str | None:
    """One line for a fault of the machine (permissions, read-only or full disk), naming the path
    and the fix; None for any other OSError (a bug of moai's: its traceback is kept)."""
    import errno
    import shlex

    from moai.hardware import free_bytes

    where = err.filename or "a file moai writes"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        free = f" ({free_bytes(err.filename) / 1e9:.2f} GB free there now)" if err.filename else ""
        return (
            f"no space left writing {where}{free}: free disk space or move cache_dir (or train.output_dir) "
            "to a bigger disk; nothing half-written is kept, rerun to continue"
        )
    if err.errno in (errno.EACCES, errno.EPERM) and err.filename and (blocked := unreadable(err.filename)):
        return (
            f"permission denied: {where}: moai cannot read {blocked}; make it readable by this user "
            f"(chmod a+r{'x' if os.path.isdir(blocked) else ''} {shlex.quote(blocked)}, or chown), "
            "or point the setting that names it (source.path, tokenizer.path, ...) at a copy you can read"
        )
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = "read-only file system" if err.errno == errno.EROFS else "permission denied"
        return f"{what}: {where}: make it writable, or set cache_dir (or train.output_dir) to a folder you can write"
    return None


def unreadable(path: str) -> str | None:
    """The first part of `path` this process may not read: a folder it cannot enter, or the file
    itself; None when it can read all of it (a permission error there came from writing)."""
    folder, folders = os.path.dirname(os.path.abspath(path)), []
    while folder not in folders:  # the root is its own dirname
        folders.append(folder)
        folder = os.path.dirname(folder)
    for folder in reversed(folders):
        if os.path.isdir(folder) and not os.access(folder, os.X_OK):
            return folder
    if os.path.isdir(path):
        return None if os.access(path, os.R_OK | os.X_OK) else path
    if os.path.exists(path) and not os.access(path, os.R_OK):
        return path
    return None
