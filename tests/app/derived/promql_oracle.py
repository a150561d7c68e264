"""An independent oracle for the truth test: PromQL expressions evaluated from first principles
on recorded scrapes, written apart from app/ (it imports nothing from it).

rate(x[w]) at t: the samples with t - w < ts <= t (at least two); their increase, where a
decrease means the counter restarted from zero (so the new value is all increase); divided by
the time between the first and the last of those samples (no extrapolation).
histogram_quantile(q, ...): Prometheus' algorithm (buckets by upper bound, cumulative counts
made monotonic, linear interpolation, the highest finite bound when the rank lands in +Inf).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

Series = list[tuple[float, float]]


def recorded_series(
    batches: Iterable[dict[str, Any]], name: str, match: dict[str, str] | None = None, host: bool = False
) -> dict[tuple[tuple[str, str], ...], Series]:
    """name{match} from the recorded batches, per label set; timestamps quantised to the
    millisecond as the store keeps them."""
    out: dict[tuple[tuple[str, str], ...], Series] = {}
    for b in batches:
        groups = [(b["host_ts"], b["host_samples"])] if host else [(s["ts"], s["samples"]) for s in b["scrapes"]]
        for ts, samples in groups:
            tq = round(ts * 1000) / 1000.0
            for smp in samples:
                if smp["name"] != name:
                    continue
                if match and any(smp["labels"].get(k) != v for k, v in match.items()):
                    continue
                key = tuple(sorted(smp["labels"].items()))
                out.setdefault(key, []).append((tq, float(smp["value"])))
    return out


def rate(series: Series, t: float, window: float) -> float | None:
    inside = [(ts, v) for ts, v in series if t - window < ts <= t]
    if len(inside) < 2:
        return None
    gained = 0.0
    for i in range(1, len(inside)):
        before, after = inside[i - 1][1], inside[i][1]
        gained += after - before if after >= before else after
    span = inside[-1][0] - inside[0][0]
    return gained / span if span > 0 else None


def sum_rate(all_series: dict[Any, Series], t: float, window: float) -> float | None:
    vals = [rate(s, t, window) for s in all_series.values()]
    got = [v for v in vals if v is not None]
    return sum(got) if got else None


def divide(a: float | None, b: float | None, k: float = 1.0) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b * k


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """buckets: (upper bound, cumulative count)."""
    if len(buckets) < 2:
        return None
    buckets = sorted(buckets)
    if not math.isinf(buckets[-1][0]):
        return None
    mono: list[tuple[float, float]] = []
    hi = -math.inf
    for ub, c in buckets:
        hi = max(hi, c)
        mono.append((ub, hi))
    observations = mono[-1][1]
    if observations <= 0:
        return None
    rank = q * observations
    b = next(i for i, (_, c) in enumerate(mono) if c >= rank)
    if b == len(mono) - 1:
        return mono[-2][0]
    if b == 0 and mono[0][0] <= 0:
        return mono[0][0]
    lower = 0.0 if b == 0 else mono[b - 1][0]
    below = 0.0 if b == 0 else mono[b - 1][1]
    in_bucket = mono[b][1] - below
    return lower + (mono[b][0] - lower) * ((rank - below) / in_bucket)


def quantile_of_rates(by_le: dict[Any, Series], q: float, t: float, window: float) -> float | None:
    buckets = []
    for key, s in by_le.items():
        le = dict(key)["le"]
        r = rate(s, t, window)
        if r is not None:
            buckets.append((float(le), r))
    return histogram_quantile(q, buckets)


def last_at(series: Series, t: float, lookback: float) -> float | None:
    before = [(ts, v) for ts, v in series if t - lookback < ts <= t]
    return before[-1][1] if before else None
