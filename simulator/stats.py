"""The engine's counters and histograms, keyed by vLLM family name and label values.

Only numbers live here; `simulator.metrics` turns them into vLLM's exposition (names, HELP, types).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
REQUEST_TIME_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PARAMS_N_BUCKETS = [1, 2, 5, 10, 20]
PREEMPTION_BUCKETS = [1, 2, 3, 4, 5, 10, 20]
OFFLOAD_SIZE_BUCKETS = [1e6, 5e6, 1e7, 2e7, 4e7, 6e7, 8e7, 1e8, 1.5e8, 2e8]
CPU_ALLOC_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144]
LOOKUP_SYNC_BUCKETS = [1e-05, 5e-05, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1]
LOOKUP_ASYNC_BUCKETS = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10]


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50 ... up to max_value."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(float(v))
        exponent += 1


@dataclass
class Histogram:
    buckets: list[float]
    counts: list[int] = field(default_factory=list)  # per bucket, NOT cumulative; last = +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.total += v
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for le, c in zip([*self.buckets, float("inf")], self.counts, strict=True):
            acc += c
            out.append(("+Inf" if le == float("inf") else repr(float(le)), float(acc)))
        return out


class Stats:
    def __init__(self, created: float) -> None:
        self.created = created
        self.counters: dict[str, dict[Labels, float]] = {}
        self.histograms: dict[str, dict[Labels, Histogram]] = {}
        self.buckets: dict[str, list[float]] = {}

    def declare_counter(self, name: str, *label_sets: dict[str, str]) -> None:
        d = self.counters.setdefault(name, {})
        for ls in label_sets:
            d.setdefault(tuple(sorted(ls.items())), 0.0)

    def declare_histogram(self, name: str, buckets: Sequence[float], *label_sets: dict[str, str]) -> None:
        self.buckets[name] = [float(b) for b in buckets]
        d = self.histograms.setdefault(name, {})
        for ls in label_sets:
            d.setdefault(tuple(sorted(ls.items())), Histogram(list(self.buckets[name])))

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        d = self.counters.setdefault(name, {})
        key = tuple(sorted(labels.items()))
        d[key] = d.get(key, 0.0) + value

    def observe(self, name: str, value: float, **labels: str) -> None:
        d = self.histograms.setdefault(name, {})
        key = tuple(sorted(labels.items()))
        h = d.get(key)
        if h is None:
            h = d[key] = Histogram(list(self.buckets[name]))
        h.observe(value)

    def get(self, name: str, **labels: str) -> float:
        return self.counters.get(name, {}).get(tuple(sorted(labels.items())), 0.0)
