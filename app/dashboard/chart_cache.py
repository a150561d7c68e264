"""One computation per chart per few seconds, however many people watch the same instance.

Every viewer of an instance asks for the same figures on the same refresh tick; named ranges end
"now", so the fragment endpoints quantise now to `quantum_s` and share the result through this
cache. Single-flight: concurrent identical requests wait for the first one instead of computing it
again (the load test's 100 dashboard clients on 2 cores depend on it).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from app.context import AppContext

T = TypeVar("T")


def quantise(now: float, quantum_s: float) -> float:
    """`now` rounded down to a multiple of the quantum (0 = unchanged)."""
    if quantum_s <= 0:
        return now
    return math.floor(now / quantum_s) * quantum_s


class ResultCache:
    """A small LRU with a time-to-live and per-key single flight. Thread-safe."""

    def __init__(self, ttl_s: float, max_entries: int = 1024, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._inflight: dict[Hashable, threading.Lock] = {}
        self.hits = 0
        self.misses = 0

    def get_or_compute(self, key: Hashable, compute: Callable[[], T], ttl_s: float | None = None) -> T:
        """The cached value of `key`, computed once when missing or older than `ttl_s` (default the
        cache's own)."""
        ttl = self.ttl_s if ttl_s is None else ttl_s
        if ttl <= 0:
            return compute()
        with self._lock:
            hit = self._fresh(key, ttl)
            if hit is not None:
                self.hits += 1
                return hit[1]  # type: ignore[no-any-return]
            flight = self._inflight.setdefault(key, threading.Lock())
        with flight:  # the first caller computes; the others wait here, then find the result
            with self._lock:
                hit = self._fresh(key, ttl)
                if hit is not None:
                    self.hits += 1
                    return hit[1]  # type: ignore[no-any-return]
            try:
                value = compute()
            finally:
                with self._lock:
                    self._inflight.pop(key, None)
            with self._lock:
                self.misses += 1
                self._entries[key] = (self.clock(), value)
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
            return value

    def _fresh(self, key: Hashable, ttl: float) -> tuple[float, Any] | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        if self.clock() - hit[0] > ttl:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return hit


def shared_cache(ctx: AppContext) -> ResultCache:
    """The process's fragment cache (one per app, `chart_cache_s` seconds per result)."""
    cache = ctx.state(ResultCache, lambda: ResultCache(ctx.settings.dashboard.chart_cache_s))
    return cache
