"""ssog_core/runtime/memory.py: freed memory inside malloc's heap goes back to the system when a heavy job ends."""

from __future__ import annotations

import os

import pytest

from ssog_core.runtime import memory

pytestmark = pytest.mark.skipif(memory._libc() is None, reason="not glibc")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_freed_memory_in_the_middle_of_the_heap_is_returned():
    """Blocks freed between live ones stay resident (the heap cannot shrink past a live block) until trimmed."""
    blocks = [bytearray(os.urandom(16) * 4096) for _ in range(3000)]  # 3000 × 64 KiB from malloc's heap
    keep = blocks[::10]
    del blocks
    before = rss_mb()
    assert memory.return_free_memory()
    assert rss_mb() < before - 100  # ~170 MB of freed blocks given back
    assert len(keep) == 300


def test_arenas_are_capped():
    assert memory.limit_malloc_arenas(2)
