"""Worker processes that leave interrupts to the process that started them.

Ctrl-C sends SIGINT to the terminal's whole process group: spawned workers would each raise
KeyboardInterrupt wherever they are (importing modules at start-up, say) and print a traceback
before the parent's one line. `spawn_pool` starts every worker of a spawn pool with SIGINT
ignored (a disposition `exec` keeps, and Python then installs no KeyboardInterrupt handler); the
parent, interrupted, terminates them (`moai.cli`). SIGINT is blocked in the parent meanwhile, so
an interrupt that arrives while the workers start is delivered to it just after, not lost.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any


@contextlib.contextmanager
def interrupts_left_to_parent() -> Iterator[None]:
    """Processes started in this block ignore SIGINT (in the main thread; elsewhere, as they are)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal dispositions belong to the main thread (the Prefect flow runs stages in others)
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a Ctrl-C meanwhile arrives now


def spawn_pool(
    num_proc: int, initializer: Callable[..., Any] | None = None, initargs: tuple[Any, ...] = ()
) -> ProcessPoolExecutor:
    """A spawn pool whose `num_proc` workers are all started now, SIGINT ignored (see above)."""
    pool = ProcessPoolExecutor(num_proc, mp_context=get_context("spawn"), initializer=initializer, initargs=initargs)
    with interrupts_left_to_parent():
        for _ in range(num_proc):
            pool.submit(int)  # a spawn pool starts a process per task while none is idle
    return pool
