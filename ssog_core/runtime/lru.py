"""The one cache: a small, thread-safe, bounded least-recently-used map, so memory stays flat however long a
process runs and however many requests repeat. The app's process caches (:class:`app.state.Caches`), a worker's
models (:func:`ssog_core.runtime.jobs.load_ref`) and the values it keeps between jobs
(:mod:`ssog_core.interventions.heavy`) are each one of these."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")
_MISSING = object()


class LRU(Generic[V]):
    """At most ``size`` values by hashable key; the least recently used goes first when a new one comes."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a cache holds at least one value, got size {size}")
        self.size = size
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def _find(self, key: Hashable) -> V | object:
        with self._lock:
            if key not in self._data:
                return _MISSING
            self._data.move_to_end(key)
            return self._data[key]

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        """The value under ``key``, made with ``make()`` and kept when missing. ``make`` runs outside the lock, so
        other requests keep being served meanwhile (two requests may then both make it: the later one is kept)."""
        found = self._find(key)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        value = make()
        self.put(key, value)
        return value

    def peek(self, key: Hashable) -> V | None:
        """The value under ``key`` (now the most recently used) or None; makes nothing."""
        found = self._find(key)
        return None if found is _MISSING else found  # type: ignore[return-value]

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def items(self) -> list[tuple[Hashable, V]]:
        """Every key and value, least recently used first; uses nothing (no value becomes more recent)."""
        with self._lock:
            return list(self._data.items())

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._data
