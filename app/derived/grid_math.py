"""Rates, gauges, ratios and histogram quantiles on a grid, from any storage tier.

Raw tier: PromQL-style rate over a window (app.derived.rates.rate_series: reset-corrected increase
between the first and last sample in (t - window, t], divided by the time between them).
Rollup tiers: the sum of the buckets' reset-corrected increases that end in (t - step, t],
divided by the time those buckets cover. Gauges: last value (raw) or bucket mean (rollups).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from app.derived.grid import Grid
from app.derived.live import LiveRawSeries, derived_memo, grid_values, memo_head, memo_store
from app.derived.rates import gauge_series, rate_series
from app.derived.series_types import TieredSeries
from app.storage.rollup_buckets import Bucket
from kvcore.series import Values, histogram_quantiles, increase


def counter_rate(s: TieredSeries, grid: Grid) -> Values:
    if not grid.times:
        return []
    if s.tier == "raw":
        step, window = grid.step, grid.rate_window

        def rates(points: Sequence[tuple[float, float]], t0: float, t1: float) -> Values:
            n = round((t1 - t0) / step) + 1
            return [v for _, v in rate_series(points, t0, t1 + 1e-9, step, window)][:n]

        if isinstance(s, LiveRawSeries):
            return grid_values(s, grid.times, step, window, gauge_window(grid) + 1.0, "rate", rates)
        return rates(s.points, grid.times[0], grid.times[-1])
    if grid.step == s.res:  # one bucket per instant: the bucket ending at t
        by_end = {b.ts + s.res: b.inc for b in s.buckets}
        res = s.res
        return [None if (inc := by_end.get(t)) is None else inc / res for t in grid.times]
    out: Values = []
    for sel in _windows(s, grid):
        incs = [b.inc for b in sel if b.inc is not None]
        out.append(sum(incs) / (len(incs) * s.res) if incs else None)
    return out


def gauge_values(s: TieredSeries, grid: Grid, use: str = "mean") -> Values:
    """Gauge on the grid. For rollups `use` picks mean, max, min or last of the buckets."""
    if not grid.times:
        return []
    if s.tier == "raw":  # the last value at or before each instant within the lookback (any `use`)
        step, window = grid.step, gauge_window(grid)

        def last(points: Sequence[tuple[float, float]], t0: float, t1: float) -> Values:
            n = round((t1 - t0) / step) + 1
            return [v for _, v in gauge_series(points, t0, t1 + 1e-9, step, window)][:n]

        if isinstance(s, LiveRawSeries):
            return grid_values(s, grid.times, step, grid.rate_window, window + 1.0, "gauge", last)
        return last(s.points, grid.times[0], grid.times[-1])
    out: Values = []
    for sel in _windows(s, grid):
        if not sel:
            out.append(None)
        elif use == "max":
            out.append(max(b.vmax for b in sel))
        elif use == "min":
            out.append(min(b.vmin for b in sel))
        elif use == "last":
            out.append(sel[-1].vlast)
        else:
            n = sum(b.n for b in sel)
            out.append(sum(b.vsum for b in sel) / n if n else None)
    return out


def gauge_window(grid: Grid) -> float:
    """How far back a raw gauge looks for its last value: the rate window (two scrape gaps, at
    least a step), at least 5 s."""
    return max(grid.rate_window, 5.0)


def _windows(s: TieredSeries, grid: Grid) -> list[list[Bucket]]:
    """For every grid instant t, the buckets that end in (t - step, t] (ascending, two pointers)."""
    out: list[list[Bucket]] = []
    bk = s.buckets
    res = s.res
    i = 0
    n = len(bk)
    for t in grid.times:
        lo = t - grid.step
        while i < n and bk[i].ts + res <= lo:
            i += 1
        j = i
        while j < n and bk[j].ts + res <= t:
            j += 1
        out.append(bk[i:j])
    return out


def add(values: Iterable[Values]) -> Values:
    """Sum of several value lists (PromQL sum): None only where every input is None."""
    lists = list(values)
    if not lists:
        return []
    if len(lists) == 1:
        return list(lists[0])
    out: Values = []
    for col in zip(*lists, strict=True):
        present = [v for v in col if v is not None]
        out.append(sum(present) if present else None)
    return out


def scale(values: Values, k: float) -> Values:
    return [v * k if v is not None else None for v in values]


def sum_by(
    series: Sequence[TieredSeries], label: str, grid: Grid, fn: Callable[[TieredSeries, Grid], Values]
) -> dict[str, Values]:
    """fn on each series, summed per value of `label` (other labels such as engine summed away)."""
    groups: dict[str, list[Values]] = defaultdict(list)
    for s in series:
        groups[str(s.labels.get(label, ""))].append(fn(s, grid))
    return {k: add(v) for k, v in groups.items()}


def total(series: Sequence[TieredSeries], grid: Grid, fn: Callable[[TieredSeries, Grid], Values]) -> Values | None:
    if not series:
        return None
    return add(fn(s, grid) for s in series)


def quantile_series(series: Sequence[TieredSeries], qs: Sequence[float], grid: Grid) -> dict[float, Values]:
    """TTFT/ITL quantiles from the `_bucket{le}` counters: rate per bucket (summed over other
    labels), then histogram_quantile at each instant. Live series: the quantiles of final
    instants are memoised too (only the new instants are computed)."""
    memo = derived_memo(series, "quantile") if grid.tier == "raw" else None
    fns = [f"q{q!r}" for q in qs]
    heads = memo_head(memo[1], memo[0], grid.times, grid.step, grid.rate_window, fns) if memo else []
    skip = len(heads[0]) if heads else 0
    per_le: list[tuple[float, Values]] = []
    for le_s, vals in sum_by(series, "le", grid, counter_rate).items():
        try:
            per_le.append((float(le_s), vals))
        except ValueError:
            continue
    per_le.sort(key=lambda p: p[0])
    out: dict[float, Values] = {q: list(h) for q, h in zip(qs, heads, strict=True)} if heads else {q: [] for q in qs}
    les = [le for le, _ in per_le]
    cols = [vals[skip:] for _, vals in per_le]
    rows: Iterable[Sequence[float | None]] = zip(*cols, strict=True) if cols else ([] for _ in grid.times[skip:])
    sinks = [out[q].append for q in qs]
    for row in rows:
        if None in row:  # some buckets have no rate at this instant: the others still count
            kept = [(le, v) for le, v in zip(les, row, strict=True) if v is not None]
            got = histogram_quantiles(qs, [le for le, _ in kept], [v for _, v in kept])
        else:
            got = histogram_quantiles(qs, les, row)  # type: ignore[arg-type]  # no None in row
        for sink, val in zip(sinks, got, strict=True):
            sink(val)
    if memo is not None:
        memo_store(
            memo[1],
            memo[0],
            grid.times,
            grid.step,
            grid.rate_window,
            {fn: out[q] for fn, q in zip(fns, qs, strict=True)},
        )
    return out


def range_increase(s: TieredSeries, start: float, end: float) -> float:
    """Reset-corrected increase of a counter over [start, end] from whichever tier it came. Raw:
    counted from the last fetched point before start (app.storage.raw_store.counter_increases
    does the same in the database); rollups: the buckets inside the range, each counted from the
    sample before it."""
    if s.tier == "raw":
        pts = _all_points(s)
        inside = [p for p in pts if start <= p[0] <= end]
        if not inside:
            return 0.0
        before = [p for p in pts if p[0] < start]
        return increase(before[-1:] + inside)
    return sum(b.inc or 0.0 for b in s.buckets if b.ts >= start and b.ts + s.res <= end + 1e-9)


def last_value(s: TieredSeries, at: float) -> float | None:
    if s.tier == "raw":
        pts = [p for p in _all_points(s) if p[0] <= at]
        return pts[-1][1] if pts else None
    bs = [b for b in s.buckets if b.ts <= at]
    return bs[-1].vlast if bs else None


def _all_points(s: TieredSeries) -> Sequence[tuple[float, float]]:
    """Every raw point of the range (a live series holds only its tail: load the rest)."""
    return s.handle.full_points() if isinstance(s, LiveRawSeries) and s.handle is not None else s.points
