"""A long-lived process's memory under glibc (the app's server, a heavy-job worker): fewer malloc arenas, and freed
memory given back after heavy work, so the resident size reflects what the process holds (benchmarks/load_app.py
measures the server's). Both are no-ops where the C library is not glibc."""

from __future__ import annotations

import ctypes
from functools import cache

M_ARENA_MAX = -8  # glibc's mallopt() parameter number


@cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas. By default every thread that allocates may get its own (up to 8 per core), and
    memory freed by a request stays in the arena of the worker thread that ran it, so the server's resident memory
    creeps up under concurrent requests; two arenas keep it flat (benchmarks/load_app.py). False if not glibc."""
    libc = _libc()
    return bool(libc and libc.mallopt(M_ARENA_MAX, arenas))


def return_free_memory() -> bool:
    """Give memory freed inside malloc's arenas back to the system (``malloc_trim``): a validation pass or a sweep
    frees hundreds of MB of activations that would otherwise stay resident until the same arena needs them again.
    Takes milliseconds; called when a heavy job ends. False if not glibc or nothing was returned."""
    libc = _libc()
    return bool(libc and libc.malloc_trim(0))
