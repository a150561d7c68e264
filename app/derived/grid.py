"""Evaluation instants of a chart: aligned to the step so refreshes line up."""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.storage.rollups import DEFAULT_PX, TIER_RES


@dataclass(frozen=True)
class Grid:
    start: float
    end: float
    step: float
    tier: str
    times: list[float]
    window: float = 0.0  # raw tier: the rate window (seconds); 0 = step

    @property
    def rate_window(self) -> float:
        return max(self.window, self.step)

    @property
    def res(self) -> float:
        return TIER_RES[self.tier]


def make_grid(start: float, end: float, tier: str, px: int = DEFAULT_PX, scrape_gap: float | None = None) -> Grid:
    """Step = the tier's resolution or span/px, whichever is larger (<= 1 point per pixel column),
    in whole seconds; instants are multiples of the step inside [start, end]."""
    span = max(end - start, 1.0)
    step = max(TIER_RES[tier], float(math.ceil(span / px)), 1.0)
    if tier != "raw":
        res = TIER_RES[tier]
        step = math.ceil(step / res) * res  # whole buckets per step
    first = math.ceil(start / step) * step
    n = math.floor((end - first) / step + 1e-9) + 1 if end >= first else 0
    # rate window on raw samples: at least the step and two scrape gaps, like rate(x[w]) in PromQL
    window = max(step, 2.0 * scrape_gap) if scrape_gap else step
    return Grid(start, end, step, tier, [first + i * step for i in range(n)], window)
