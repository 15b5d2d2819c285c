"""Ctrl-C and SIGTERM: the command unwinds (every cleanup on the way), its workers stop with it, and
one line is printed; a second signal leaves at once."""

from __future__ import annotations

import os
import signal
import sys


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException, like KeyboardInterrupt, so no `except Exception`
    swallows it: it unwinds the command, running every cleanup on the way."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_MAIN_PID: int | None = None  # the process that runs the command (forked workers inherit the handler)


def _on_signal(signum: int, frame) -> None:
    if os.getpid() != _MAIN_PID:
        # A forked worker: its parent stops it. Ctrl-C reaches the whole process group, and a
        # worker's own KeyboardInterrupt would print a traceback; SIGTERM (the parent's) ends it.
        if signum == signal.SIGTERM:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_second_signal)
    _stop_workers()
    raise Interrupted(signum)


def _unraisable(unraisable) -> None:
    """An `Interrupted` raised where Python can only print and drop it (a `__del__`, a weakref
    callback): no traceback; it is raised again 50 ms later from a timer (SIGALRM), by then out of
    that spot (or, if not, dropped here and timed again), so the command still stops, one line."""
    err = unraisable.exc_value
    if isinstance(err, Interrupted) and os.getpid() == _MAIN_PID:
        try:
            signal.signal(signal.SIGALRM, lambda _s, _f: _raise_again(err.signum))
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        except ValueError:  # not the main thread: nothing to time it from
            pass
    _previous_unraisablehook(unraisable)


def _raise_again(signum: int) -> None:
    raise Interrupted(signum)


_previous_unraisablehook = sys.unraisablehook  # what main() found (pytest's, in a test)


def _install_handlers() -> None:
    """Ctrl-C and SIGTERM (a scheduler, `kill`) unwind the command: a stage being built drops its
    temporary folder, a launch takes its process group down; then one line, exit 130 or 143."""
    global _MAIN_PID, _previous_unraisablehook
    _MAIN_PID = os.getpid()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)
    if sys.unraisablehook is not _unraisable:
        _previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _unraisable


def _on_second_signal(signum: int, frame) -> None:
    """Asked again while cleaning up: leave at once (a stage's temporary folder is removed by its next build)."""
    print(f"moai: interrupted again ({signal.Signals(signum).name}); leaving at once", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def _stop_workers() -> None:
    """Terminate this process's worker processes (pools of multiprocessing and multiprocess), so a
    pool being unwound does not wait for the work still queued on them."""
    for name in ("multiprocessing", "multiprocess"):
        module = sys.modules.get(name)
        if module is None:
            continue
        for child in module.active_children():
            child.terminate()


def _interrupted(signum: int) -> int:
    """The one line for an interrupted command; its exit code (128 + the signal)."""
    print(
        f"moai: interrupted ({signal.Signals(signum).name}); nothing half-written is kept: rerun the same "
        "command to continue",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum
