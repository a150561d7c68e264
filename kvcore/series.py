"""Series arithmetic, defined once: reset-corrected counter increase and rate, Prometheus'
histogram_quantile, and the share (ratio) of two volumes. Pure functions, standard library only.

The dashboard (app/derived), the alerts (app/alerts), the exporter (app/export), A/B
(agent/workloads, app/ab) and sizing (app/sizing) all compute through here.

A decrease of a cumulative counter is a reset (the process restarted and counts from zero):
the increase across it is the new value, never negative (`reset_step`, the one place that rule
is written; the SQL aggregate in app/storage/raw_store.py is its SQL twin, checked against it).
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

Point = tuple[float, float]  # (ts seconds, value)
Values = list[float | None]


def reset_step(prev: float, cur: float) -> float:
    """The increase of a counter from `prev` to `cur`: `cur` itself when it went down (a reset)."""
    return cur - prev if cur >= prev else cur


def steps(points: Sequence[Point]) -> list[float]:
    """The reset-corrected increase into each point (0.0 for the first): a window's increase is
    the in-order sum of its steps, the same additions as `increase`."""
    out = [0.0] * len(points)
    for i in range(1, len(points)):
        out[i] = reset_step(points[i - 1][1], points[i][1])
    return out


def increase_of_values(values: Iterable[float]) -> float:
    """Reset-corrected increase from the first to the last of a counter's values, in order."""
    return sum((reset_step(prev, cur) for prev, cur in itertools.pairwise(values)), 0.0)


def increase(points: Sequence[Point]) -> float:
    """Reset-corrected increase from the first to the last point."""
    return increase_of_values(v for _, v in points)


def reset_times(points: Sequence[Point]) -> list[float]:
    """Timestamps of the points where the counter went down."""
    return [t for (_, prev), (t, cur) in itertools.pairwise(points) if cur < prev]


def rate(points: Sequence[Point]) -> float | None:
    """Per-second rate between the first and the last point (reset-corrected, no extrapolation);
    None with fewer than two points or no time between them."""
    if len(points) < 2:
        return None
    dt = points[-1][0] - points[0][0]
    if dt <= 0:
        return None
    return increase(points) / dt


def extend_running_increase(points: Sequence[Point], cum: list[float], reset_idx: list[int], start: int) -> None:
    """Extend `cum` (the running reset-corrected increase aligned with the points) and `reset_idx`
    (the indices j where points[j] < points[j - 1]) for points[start:]; cum covers points[:start]."""
    for j in range(start, len(points)):
        if j == 0:
            cum.append(0.0)
            continue
        prev, cur = points[j - 1][1], points[j][1]
        cum.append(cum[-1] + reset_step(prev, cur))
        if cur < prev:
            reset_idx.append(j)


@dataclass(frozen=True)
class Series:
    """One series: its labels and ascending (ts, value) points. `cum` (optional) is the
    reset-corrected running increase aligned with the points and `reset_idx` the indices j where
    points[j] < points[j - 1]: with them a window's increase is two lookups instead of a walk over
    a day of samples (see `indexed`)."""

    labels: Mapping[str, str]
    points: Sequence[Point]
    cum: Sequence[float] | None = None
    reset_idx: Sequence[int] = ()

    def increase(self) -> float:
        return increase(self.points)

    def rate(self) -> float | None:
        return rate(self.points)

    def resets(self) -> list[float]:
        return reset_times(self.points)


def indexed(labels: Mapping[str, str], points: Sequence[Point]) -> Series:
    """A Series with its running increase and reset indices computed."""
    cum: list[float] = []
    resets: list[int] = []
    extend_running_increase(points, cum, resets, 0)
    return Series(labels, points, cum, resets)


def histogram_quantiles(qs: Sequence[float], les: Sequence[float], vals: Sequence[float]) -> list[float | None]:
    """Prometheus histogram_quantile for several q: `les` ascending upper bounds (the last +Inf),
    `vals` their cumulative counts (or rates, or increases). Linear interpolation inside the
    bucket, the first bucket starting at 0, the highest finite bound when the rank falls in +Inf;
    None without a +Inf bucket, with fewer than two buckets or without observations."""
    n = len(les)
    if n < 2 or les[-1] != math.inf:
        return [None] * len(qs)
    # cumulative counts must not decrease (scrape races): fix like Prometheus does (running max)
    cum = list(accumulate(vals, max, initial=-math.inf))
    del cum[0]
    count = cum[-1]
    if count <= 0:
        return [None] * len(qs)
    out: list[float | None] = []
    for q in qs:
        rank = q * count
        i = bisect_left(cum, rank)  # the first bucket whose cumulative count reaches the rank
        if i >= n:
            out.append(None)
            continue
        le, c = les[i], cum[i]
        prev_le, prev_c = (les[i - 1], cum[i - 1]) if i else (0.0, 0.0)
        if le == math.inf:
            out.append(les[-2])
        elif (i == 0 and le <= 0) or c == prev_c:
            out.append(le)
        else:
            out.append(prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c))
    return out


def histogram_quantile(q: float, buckets: Mapping[float, float | None]) -> float | None:
    """histogram_quantile on one instant: `buckets` maps each `le` to its cumulative count (or
    rate, or increase); None values are left out."""
    items = sorted((le, v) for le, v in buckets.items() if v is not None)
    return histogram_quantiles((q,), [le for le, _ in items], [v for _, v in items])[0]


def share(part: float | None, whole: float | None) -> float | None:
    """part / whole in 0..1; None without volume (a window without traffic has no hit rate)."""
    if part is None or whole is None or whole <= 0:
        return None
    return max(0.0, min(1.0, part / whole))


def ratio(num: Values, den: Values, scale: float = 1.0) -> Values:
    """Per instant num / den x scale where den > 0, else None (no traffic: no ratio, not 0 %).
    Not clamped (a quotient of any two grids: bytes per token, seconds per request ...)."""
    return [
        (a / b) * scale if a is not None and b is not None and b > 0 else None for a, b in zip(num, den, strict=True)
    ]
