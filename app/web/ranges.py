"""The range picker's ranges: named (15m ... 30d) or custom start/end (Unix seconds)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastapi import HTTPException

RANGES: dict[str, float] = {
    "5m": 300.0,
    "15m": 900.0,
    "1h": 3600.0,
    "6h": 6 * 3600.0,
    "24h": 86400.0,
    "7d": 7 * 86400.0,
    "30d": 30 * 86400.0,
}
DEFAULT_RANGE = "1h"
FIT_MARGIN = 1.2  # the default range holds the instance's data with this much room to spare
MAX_CUSTOM_S = 400 * 86400.0


@dataclass(frozen=True)
class TimeRange:
    name: str  # one of RANGES, or "custom"
    start: float
    end: float

    def query(self) -> str:
        if self.name == "custom":
            return f"range=custom&start={self.start:.0f}&end={self.end:.0f}"
        return f"range={self.name}"


def resolve(now: float, range_: str | None, start: float | None, end: float | None) -> TimeRange:
    """A named range ends now; 'custom' (or start/end given) needs both, start < end. 400 on bad input."""
    name = (range_ or "").strip() or (DEFAULT_RANGE if start is None and end is None else "custom")
    if name == "custom":
        if start is None or end is None:
            raise HTTPException(400, "a custom range needs both start and end (Unix seconds)")
        if not (math.isfinite(start) and math.isfinite(end)):
            raise HTTPException(400, "start and end must be finite Unix times in seconds")
        if start >= end:
            raise HTTPException(400, "start must be before end")
        if end - start > MAX_CUSTOM_S:
            raise HTTPException(400, "a custom range may span at most 400 days")
        return TimeRange("custom", start, end)
    if name not in RANGES:
        raise HTTPException(400, f"unknown range {name!r}: use one of {', '.join(RANGES)} or custom")
    return TimeRange(name, now - RANGES[name], now)


def default_range(now: float, first_seen: object) -> str:
    """The range an instance page opens on: the shortest named range that holds all the data the
    instance has (with FIT_MARGIN to spare), so a fresh demo fills the chart instead of sitting in
    a sliver at the right of an hour; DEFAULT_RANGE once the instance is older than that."""
    try:
        age = now - float(first_seen)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return DEFAULT_RANGE
    if not math.isfinite(age) or age < 0:
        return DEFAULT_RANGE
    for name, span in RANGES.items():
        if span >= age * FIT_MARGIN or span >= RANGES[DEFAULT_RANGE]:
            return name
    return DEFAULT_RANGE
