"""Loads the series a rule reads: all the metrics of a target in one batched read per lookback
through the series reader (app.derived.series_reader), whose series cache fetches only the
samples that are new since the last evaluation and drops what a late sample made stale (a 24 h
baseline every 15 s would otherwise re-read the whole day). Each series carries its running
reset-corrected sum (kvcore.series.Series.cum): kept per series between evaluations and extended
over the new points only, recomputed whole when the points are not the previous ones plus new
ones (a late sample moved the series' write generation, or the start moved back)."""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Engine

from app.derived.series_reader import SeriesQuery, TieredSeries, by_name, read_series
from kvcore.series import Point, Series, extend_running_increase

# Points kept before the window start, to anchor an increase over the window.
ANCHOR_S = 120.0


@dataclass
class _Sums:
    gen: int
    points: list[Point]  # what the sums were computed on
    cum: list[float]
    resets: list[int]


class SeriesInputs:
    """The evaluator's reads: series by metric name, each with its running sum."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sums: dict[int, _Sums] = {}
        self._read: set[int] = set()  # series read since the last forget_unread
        self._lock = threading.Lock()
        self.extended = 0  # series whose sums were only extended (tests, benchmarks)
        self.recomputed = 0

    def get(
        self, name: str, start: float, end: float, *, instance_id: int | None = None, host_id: int | None = None
    ) -> list[Series]:
        return self.get_many({name: start}, end, instance_id=instance_id, host_id=host_id)[name]

    def get_many(
        self, starts: Mapping[str, float], end: float, *, instance_id: int | None = None, host_id: int | None = None
    ) -> dict[str, list[Series]]:
        """Series of each metric name from its start (minus the anchor) to end: one read per
        distinct start."""
        groups: dict[float, list[str]] = defaultdict(list)
        for name, start in starts.items():
            groups[start - ANCHOR_S].append(name)
        out: dict[str, list[Series]] = {}
        for lo, names in groups.items():
            found = read_series(self.engine, SeriesQuery(names, lo, end, instance_id=instance_id, host_id=host_id))
            for name, got in by_name(found, names).items():
                out[name] = [self._indexed(sp) for sp in got]
        return out

    def _indexed(self, sp: TieredSeries) -> Series:
        pts = sp.points
        with self._lock:
            prev = self._sums.get(sp.series_id)
            cum: list[float]
            resets: list[int]
            keep = _overlap(prev, sp) if prev is not None else None
            if prev is not None and keep is not None:
                cut, n = keep
                cum = prev.cum[cut:]
                resets = [j - cut for j in prev.resets if j - cut >= 1]
                self.extended += 1
            else:
                cum, resets, n = [], [], 0
                self.recomputed += 1
            extend_running_increase(pts, cum, resets, n)
            self._sums[sp.series_id] = _Sums(sp.write_gen, pts, cum, resets)
            self._read.add(sp.series_id)
        return Series(dict(sp.labels), pts, cum, resets)

    def forget_unread(self) -> None:
        """Drop the sums of series not read since the last call (targets and rules gone)."""
        with self._lock:
            self._sums = {sid: s for sid, s in self._sums.items() if sid in self._read}
            self._read = set()

    def forget(self) -> None:
        with self._lock:
            self._sums.clear()
            self._read.clear()


def _overlap(prev: _Sums, sp: TieredSeries) -> tuple[int, int] | None:
    """(cut, n): the new points are the previous ones from index `cut` on (n of them), then new
    ones after them; None when they are not (another write generation, an earlier start)."""
    old, new = prev.points, sp.points
    if prev.gen != sp.write_gen or not old or not new:
        return None
    cut = bisect.bisect_left(old, new[0])
    n = len(old) - cut
    if cut >= len(old) or old[cut] != new[0] or n > len(new) or new[n - 1] != old[-1]:
        return None
    return cut, n
