"""`moai.heap.trim` hands freed memory back: resident memory drops after it, on glibc."""

import sys

import pytest

from moai import heap


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's (Linux)")
def test_trim_releases_memory_freed_between_live_blocks():
    # 2 KB blocks (glibc's heap, not Python's small-object arenas), every tenth kept alive so the
    # heap cannot shrink from its top: glibc keeps the rest resident until a trim
    blocks = [bytes(2048) + bytes([i % 256]) for i in range(150_000)]
    kept = blocks[::10]
    del blocks
    before = _rss_mb()
    heap.trim()
    after = _rss_mb()
    assert before - after > 100, (before, after)
    assert len(kept) == 15_000
