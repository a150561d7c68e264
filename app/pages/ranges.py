"""The range picker's ranges: named (15m ... 30d) or custom start/end (Unix seconds)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastapi import HTTPException

RANGES: dict[str, float] = {
    "15m": 900.0,
    "1h": 3600.0,
    "6h": 6 * 3600.0,
    "24h": 86400.0,
    "7d": 7 * 86400.0,
    "30d": 30 * 86400.0,
}
DEFAULT_RANGE = "1h"
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
