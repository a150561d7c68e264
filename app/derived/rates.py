"""Counter rates and gauges on a query grid (PromQL-style). Pure functions.

The counter arithmetic itself (a decrease is a reset: the increase across it is the new value,
never negative) is kvcore.series; this module walks it over windows and grid instants.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from kvcore.series import Point, rate, steps


def step_grid(start: float, end: float, step: float) -> list[float]:
    """Evaluation instants start, start+step, ... <= end (like PromQL query_range)."""
    n = math.floor((end - start) / step + 1e-9)
    return [start + i * step for i in range(n + 1)]


def rate_at(points: Sequence[Point], t: float, window: float) -> float | None:
    """Per-second rate over (t - window, t]: reset-corrected increase between the first and the
    last sample inside the window, divided by the time between them (no extrapolation).
    None when fewer than two samples fall in the window."""
    return rate([p for p in points if t - window < p[0] <= t])


def rate_series(
    points: Sequence[Point], start: float, end: float, step: float, window: float | None = None
) -> list[tuple[float, float | None]]:
    """rate_at evaluated on the query grid. The window defaults to max(step, 2 x scrape gap)."""
    w = window if window is not None else max(step, 2.0 * _median_gap(points))
    # Walk with two indices so a long range stays O(n + grid); the reset-corrected step between
    # consecutive samples is computed once, and a window's increase is the in-order sum of its
    # steps (the same additions as kvcore.series.increase, so the same bits as rate_at).
    n = len(points)
    ts = [p[0] for p in points]
    inc = steps(points)
    out: list[tuple[float, float | None]] = []
    lo = 0
    hi = 0
    for t in step_grid(start, end, step):
        while hi < n and ts[hi] <= t:
            hi += 1
        while lo < hi and ts[lo] <= t - w:
            lo += 1
        if hi - lo < 2 or (dt := ts[hi - 1] - ts[lo]) <= 0:
            out.append((t, None))
        else:
            out.append((t, sum(inc[lo + 1 : hi], 0.0) / dt))
    return out


def gauge_series(
    points: Sequence[Point], start: float, end: float, step: float, window: float | None = None
) -> list[tuple[float, float | None]]:
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
