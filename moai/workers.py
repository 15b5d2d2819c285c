"""Worker processes that leave interrupts to the process that started them.

Ctrl-C sends SIGINT to the terminal's whole process group: spawned workers would each raise
KeyboardInterrupt wherever they are (importing modules at start-up, say) and print a traceback
before the parent's one line. `spawn_pool` starts every worker of a spawn pool with SIGINT
blocked (a signal mask that `fork` and `exec` keep; the worker never sees a Ctrl-C); the parent,
interrupted, terminates them (`moai.cli`). An interrupt that reaches the parent while the workers
start is held and handled just after, not lost. (Ignoring SIGINT in the parent meanwhile, as an
earlier version did, lost it whenever another thread of the parent was running: the kernel hands
a process's signal to any thread that does not block it, and an ignored signal is dropped.)
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context, resource_tracker
from typing import Any


@contextlib.contextmanager
def interrupts_left_to_parent() -> Iterator[None]:
    """Processes started in this block never see SIGINT (in the main thread; elsewhere, as they
    are). One that reaches this process meanwhile is handled when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal dispositions belong to the main thread (the Prefect flow runs stages in others)
        return
    # multiprocessing starts its resource tracker at the first spawn and then unblocks SIGINT in the
    # caller, which would undo the block below for that first worker: started first, it leaves it be
    resource_tracker.ensure_running()
    arrived: list[int] = []
    handler = signal.signal(signal.SIGINT, lambda signum, _frame: arrived.append(signum))
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # what the children inherit
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # one held by the kernel arrives now
        signal.signal(signal.SIGINT, handler)
        if arrived:  # taken meanwhile by another thread of this process: handled as it would have been
            signal.raise_signal(signal.SIGINT)


def spawn_pool(
    num_proc: int, initializer: Callable[..., Any] | None = None, initargs: tuple[Any, ...] = ()
) -> ProcessPoolExecutor:
    """A spawn pool whose `num_proc` workers are all started now, SIGINT blocked (see above)."""
    pool = ProcessPoolExecutor(num_proc, mp_context=get_context("spawn"), initializer=initializer, initargs=initargs)
    with interrupts_left_to_parent():
        for _ in range(num_proc):
            pool.submit(int)  # a spawn pool starts a process per task while none is idle
    return pool
