"""Counter arithmetic in one place: increases, per-second rates, resets. Pure functions.

A decrease of a cumulative counter is a reset (the process restarted and counts from zero):
the increase across it is the new value, never negative.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

Point = tuple[float, float]


def increase(points: Sequence[Point]) -> float:
    """Reset-corrected increase from the first to the last point."""
    total = 0.0
    for (_, prev), (_, cur) in itertools.pairwise(points):
        total += cur - prev if cur >= prev else cur
    return total


def reset_times(points: Sequence[Point]) -> list[float]:
    return [t for (_, prev), (t, cur) in itertools.pairwise(points) if cur < prev]


def step_grid(start: float, end: float, step: float) -> list[float]:
    """Evaluation instants start, start+step, ... <= end (like PromQL query_range)."""
    n = math.floor((end - start) / step + 1e-9)
    return [start + i * step for i in range(n + 1)]


def rate_at(points: Sequence[Point], t: float, window: float) -> float | None:
    """Per-second rate over (t - window, t]: reset-corrected increase between the first and the
    last sample inside the window, divided by the time between them (no extrapolation).
    None when fewer than two samples fall in the window."""
    inside = [p for p in points if t - window < p[0] <= t]
    if len(inside) < 2:
        return None
    dt = inside[-1][0] - inside[0][0]
    if dt <= 0:
        return None
    return increase(inside) / dt


def rate_series(points: Sequence[Point], start: float, end: float, step: float, window: float | None = None) -> list[
    tuple[float, float | None]
]:
    """rate_at evaluated on the query grid. The window defaults to max(step, 2 x scrape gap)."""
    w = window if window is not None else max(step, 2.0 * _median_gap(points))
    # Walk with two indices so a long range stays O(n + grid).
    out: list[tuple[float, float | None]] = []
    lo = 0
    hi = 0
    n = len(points)
    for t in step_grid(start, end, step):
        while hi < n and points[hi][0] <= t:
            hi += 1
        while lo < hi and points[lo][0] <= t - w:
            lo += 1
        out.append((t, rate_at(points[lo:hi], t, w)))
    return out


def gauge_series(points: Sequence[Point], start: float, end: float, step: float, window: float | None = None) -> list[
    tuple[float, float | None]
]:
    """Last value at or before each grid instant, within the lookback window (PromQL-style)."""
    w = window if window is not None else max(step, 2.0 * _median_gap(points), 5.0)
    out: list[tuple[float, float | None]] = []
    hi = 0
    n = len(points)
    for t in step_grid(start, end, step):
        while hi < n and points[hi][0] <= t:
            hi += 1
        if hi and points[hi - 1][0] > t - w:
            out.append((t, points[hi - 1][1]))
        else:
            out.append((t, None))
    return out


def _median_gap(points: Sequence[Point]) -> float:
    if len(points) < 2:
        return 1.0
    gaps = sorted(b[0] - a[0] for a, b in itertools.pairwise(points))
    return max(gaps[len(gaps) // 2], 1e-3)
