"""Window arithmetic over raw points, for the rules. Pure functions.

Counters are cumulative; a decrease is a reset (restart) and the increase across it is the new
value (kvcore.series, which also defines the Series type these functions take). A window
(start, end] is anchored on the last point at or before `start` (if it is recent enough), so an
increase over 5 minutes covers 5 minutes of counting, not 5 minutes minus one scrape gap.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kvcore.series import Point, Series, increase, reset_times


@dataclass(frozen=True)
class Window:
    """The result of an increase over a window: None when no series had two points inside."""

    value: float | None
    resets: tuple[float, ...] = ()
    covered_s: float = 0.0  # time between the first and last point used


@dataclass(frozen=True)
class SeriesMap:
    """Metric name -> its series (all label sets) for one target."""

    by_name: Mapping[str, Sequence[Series]] = field(default_factory=dict)

    def get(self, name: str) -> Sequence[Series]:
        return self.by_name.get(name, ())

    def has(self, name: str) -> bool:
        return any(s.points for s in self.by_name.get(name, ()))


LabelFilter = Callable[[Mapping[str, str]], bool] | None


def _bounds(points: Sequence[Point], start: float, end: float, anchor_s: float) -> tuple[int, int]:
    """Indices [i0, i1] of the points in (start, end], with the anchor (the last point in
    (start - anchor_s, start]) as i0 when there is one."""
    lo = bisect.bisect_right(points, (start, math.inf))
    hi = bisect.bisect_right(points, (end, math.inf)) - 1
    if lo > 0 and points[lo - 1][0] > start - anchor_s:
        lo -= 1
    return lo, hi


def window_points(points: Sequence[Point], start: float, end: float, anchor_s: float) -> list[Point]:
    """Points in (start, end], preceded by the last point in (start - anchor_s, start] if any."""
    i0, i1 = _bounds(points, start, end, anchor_s)
    return list(points[i0 : i1 + 1])


def window_increase(
    series: Sequence[Series], start: float, end: float, *, where: LabelFilter = None, anchor_s: float = 120.0
) -> Window:
    """Sum over the series (matching `where`) of the reset-corrected increase in (start, end]."""
    total = 0.0
    any_value = False
    resets: list[float] = []
    covered = 0.0
    for s in series:
        if where is not None and not where(s.labels):
            continue
        i0, i1 = _bounds(s.points, start, end, anchor_s)
        if i1 - i0 < 1:
            continue
        any_value = True
        if s.cum is not None:
            total += s.cum[i1] - s.cum[i0]
            lo = bisect.bisect_right(s.reset_idx, i0)
            hi = bisect.bisect_right(s.reset_idx, i1)
            resets.extend(s.points[j][0] for j in s.reset_idx[lo:hi])
        else:
            pts = s.points[i0 : i1 + 1]
            total += increase(pts)
            resets.extend(reset_times(pts))
        covered = max(covered, s.points[i1][0] - s.points[i0][0])
    return Window(total if any_value else None, tuple(sorted(set(resets))), covered)


def latest(series: Sequence[Series], now: float, max_age_s: float, *, where: LabelFilter = None) -> float | None:
    """Sum over the series of their last value at or before now, if younger than max_age_s."""
    total = 0.0
    found = False
    for s in series:
        if where is not None and not where(s.labels):
            continue
        for t, v in reversed(s.points):
            if t <= now:
                if now - t <= max_age_s and math.isfinite(v):
                    total += v
                    found = True
                break
    return total if found else None


def latest_min(series: Sequence[Series], now: float, max_age_s: float) -> float | None:
    """Smallest of the series' last values (e.g. the worst GPU), if young enough."""
    vals = [latest([s], now, max_age_s) for s in series]
    known = [v for v in vals if v is not None]
    return min(known) if known else None


def sample_times(series: Sequence[Series], start: float, end: float) -> list[float]:
    """Timestamps of the samples in (start, end] (the scrape instants), ascending."""
    ts: set[float] = set()
    for s in series:
        ts.update(t for t, _ in s.points if start < t <= end)
    return sorted(ts)


def median_gap(series: Sequence[Series]) -> float | None:
    for s in series:
        if len(s.points) >= 3:
            gaps = sorted(b[0] - a[0] for a, b in zip(s.points, s.points[1:], strict=False))
            return gaps[len(gaps) // 2]
    return None


def bucket_increases(
    series: Sequence[Series], start: float, end: float, *, anchor_s: float = 120.0
) -> dict[float, float]:
    """Increase per `le` bound of a histogram's _bucket series over the window, summed over the
    other labels (engines). Unparseable `le` values are skipped."""
    out: dict[float, float] = {}
    for s in series:
        raw = s.labels.get("le")
        if raw is None:
            continue
        try:
            le = float(raw)
        except ValueError:
            continue
        w = window_increase([s], start, end, anchor_s=anchor_s)
        if w.value is None:
            continue
        out[le] = out.get(le, 0.0) + w.value
    return out
