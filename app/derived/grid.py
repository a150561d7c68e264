"""Evaluation instants of a chart: aligned to the step so refreshes line up.

At most MAX_POINTS instants per trace whatever the range (the step follows the plot's width in
pixels, which the page sends); the rate window on raw samples is Grafana's $__rate_interval,
max(step + scrape interval, 4 x scrape interval), and at least MIN_RATE_WINDOW_S, so every window
holds several scrapes and consecutive windows overlap or touch (no traffic falls between two
instants).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.derived.series_reader import TIER_RES

MAX_POINTS = 600  # per trace, whatever the range and the screen
DEFAULT_POINTS = MAX_POINTS  # when the page has not told its plot width yet
MIN_POINTS = 20  # a very narrow plot still gets a readable line
# Raw rates are never taken over less than this: a 1 s scrape makes $__rate_interval 4 s, and at a
# few requests per second a 4 s window holds a handful of requests, so hit rates swung 0-100 %
# from point to point and token areas were spikes; 30 s is what the overview sparklines use.
MIN_RATE_WINDOW_S = 30.0


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


def points_for(px: int | None) -> int:
    """Instants for a plot `px` pixels wide: one per pixel column, between MIN_POINTS and MAX_POINTS."""
    if px is None:
        return DEFAULT_POINTS
    return max(MIN_POINTS, min(MAX_POINTS, int(px)))


def rate_interval(step: float, scrape_gap: float | None) -> float:
    """Grafana's $__rate_interval: max(step + scrape interval, 4 x scrape interval); the step
    alone when the scrape interval is unknown (fewer than two samples)."""
    if not scrape_gap or scrape_gap <= 0:
        return step
    return max(step + scrape_gap, 4.0 * scrape_gap)


def make_grid(start: float, end: float, tier: str, px: int | None = None, scrape_gap: float | None = None) -> Grid:
    """Step = the tier's resolution or span / (points - 1), whichever is larger, in whole seconds
    (whole buckets on rollup tiers); instants are multiples of the step inside [start, end], so
    there are at most points_for(px) of them."""
    span = max(end - start, 1.0)
    points = points_for(px)
    step = max(TIER_RES[tier], float(math.ceil(span / (points - 1))), 1.0)
    if tier != "raw":
        res = TIER_RES[tier]
        step = math.ceil(step / res) * res  # whole buckets per step
    first = math.ceil(start / step) * step
    n = math.floor((end - first) / step + 1e-9) + 1 if end >= first else 0
    window = max(rate_interval(step, scrape_gap), MIN_RATE_WINDOW_S) if tier == "raw" else step
    return Grid(start, end, step, tier, [first + i * step for i in range(n)], window)
