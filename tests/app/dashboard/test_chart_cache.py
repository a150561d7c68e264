"""The fragment cache: TTL, LRU bound, single flight, errors not cached, now quantised."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from app.dashboard.chart_cache import ResultCache, quantise


class Tick:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_quantise() -> None:
    assert quantise(1234.9, 5) == 1230.0
    assert quantise(1235.0, 5) == 1235.0
    assert quantise(1234.9, 0) == 1234.9


def test_ttl_and_lru() -> None:
    clock = Tick()
    cache = ResultCache(ttl_s=5, max_entries=2, clock=clock)
    calls: list[str] = []

    def make(v: str) -> Any:
        def f() -> str:
            calls.append(v)
            return v

        return f

    assert cache.get_or_compute("a", make("a1")) == "a1"
    assert cache.get_or_compute("a", make("a2")) == "a1"  # fresh: reused
    clock.t = 6
    assert cache.get_or_compute("a", make("a3")) == "a3"  # expired: recomputed
    cache.get_or_compute("b", make("b"))
    cache.get_or_compute("c", make("c"))  # evicts the least recently used ("a")
    assert cache.get_or_compute("a", make("a4")) == "a4"
    assert calls == ["a1", "a3", "b", "c", "a4"]
    assert cache.hits == 1


def test_errors_are_not_cached() -> None:
    cache = ResultCache(ttl_s=5)

    def boom() -> str:
        raise ValueError("no data")

    with pytest.raises(ValueError):
        cache.get_or_compute("k", boom)
    assert cache.get_or_compute("k", lambda: "ok") == "ok"


def test_single_flight_computes_once_for_concurrent_callers() -> None:
    cache = ResultCache(ttl_s=60)
    started = threading.Event()
    release = threading.Event()
    calls = []

    def slow() -> str:
        calls.append(1)
        started.set()
        release.wait(10)
        return "figure"

    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(cache.get_or_compute("k", slow)))
    first.start()
    assert started.wait(10)
    others = [threading.Thread(target=lambda: results.append(cache.get_or_compute("k", slow))) for _ in range(5)]
    for t in others:
        t.start()
    release.set()
    for t in [first, *others]:
        t.join(10)
    assert results == ["figure"] * 6
    assert len(calls) == 1


def test_disabled_cache_always_computes() -> None:
    cache = ResultCache(ttl_s=0)
    n = []
    for _ in range(3):
        cache.get_or_compute("k", lambda: n.append(1))
    assert len(n) == 3
