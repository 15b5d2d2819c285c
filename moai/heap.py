"""Memory a process has freed, handed back to the system (glibc's `malloc_trim`).

glibc keeps what a process frees in its heaps for later allocations, resident. In `moai prepare`
that added up: building fastokens for a 128k vocabulary leaves ~160 MB freed but resident (RSS
+247 MB after the build, +89 MB after a trim), and the stages before tokenize ~300 MB more, so the
run's peak RSS depended on what happened to overlap (docs/performance.md, "Calls sized by the
text"). `trim` is called after those builds and before each stage builds.
"""

from __future__ import annotations

import sys


def trim() -> None:
    """Release the free memory of every glibc heap of this process (a few ms); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        ctypes.CDLL(None).malloc_trim(0)
