"""Loads the series a rule reads from storage, with an in-process cache that fetches only new
samples between evaluations (a 24 h baseline every 15 s would otherwise re-read the whole day),
for all the metrics of a target in one batched read (app.derived.series_reader).
The cache refetches everything every `full_refresh_s`, so samples that arrive late (an agent's
spool replay) are picked up. Each cached series carries its running reset-corrected sum
(app.alerts.series.Series.cum), kept up to date incrementally."""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import Engine

from app.derived.series_reader import SeriesQuery, TieredSeries, by_name, read_series
from kvcore.series import Series, extend_running_increase

# Points kept before the window start, to anchor an increase over the window.
ANCHOR_S = 120.0


@dataclass
class _Entry:
    fetched_from: float
    fetched_to: float
    full_at: float
    labels: dict[int, dict[str, str]] = field(default_factory=dict)
    points: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    cum: dict[int, list[float]] = field(default_factory=dict)
    resets: dict[int, list[int]] = field(default_factory=dict)

    def add(self, found: list[TieredSeries]) -> int:
        """Append the new points of each series (those after what the entry holds)."""
        n = 0
        for sp in found:
            pts = self.points.setdefault(sp.series_id, [])
            self.labels.setdefault(sp.series_id, dict(sp.labels))
            last = pts[-1][0] if pts else float("-inf")
            new = [p for p in sp.points if p[0] > last]
            before = len(pts)
            pts.extend(new)
            extend_running_increase(
                pts, self.cum.setdefault(sp.series_id, []), self.resets.setdefault(sp.series_id, []), before
            )
            n += len(new)
        return n

    def trim(self, lo: float) -> None:
        if lo <= self.fetched_from:
            return
        for sid, pts in self.points.items():
            cut = bisect.bisect_left(pts, (lo, float("-inf")))
            if cut:
                self.points[sid] = pts[cut:]
                self.cum[sid] = self.cum[sid][cut:]  # differences stay valid
                self.resets[sid] = [j - cut for j in self.resets[sid] if j - cut >= 1]
        self.fetched_from = lo

    def view(self, end: float) -> list[Series]:
        out = []
        for sid, pts in self.points.items():
            hi = bisect.bisect_right(pts, (end, float("inf")))
            resets = self.resets[sid]
            out.append(Series(self.labels[sid], pts[:hi], self.cum[sid][:hi], resets[: bisect.bisect_left(resets, hi)]))
        return out


class SeriesCache:
    def __init__(self, engine: Engine, *, full_refresh_s: float = 600.0) -> None:
        self.engine = engine
        self.full_refresh_s = full_refresh_s
        self._entries: dict[tuple[int | None, int | None, str], _Entry] = {}
        self._lock = threading.Lock()
        self.rows_read = 0  # for the benchmark and tests
        self.queries = 0

    def get(
        self, name: str, start: float, end: float, *, instance_id: int | None = None, host_id: int | None = None
    ) -> list[Series]:
        return self.get_many({name: start}, end, instance_id=instance_id, host_id=host_id)[name]

    def get_many(
        self, starts: Mapping[str, float], end: float, *, instance_id: int | None = None, host_id: int | None = None
    ) -> dict[str, list[Series]]:
        """Series of each metric name from its start (minus the anchor) to end."""
        with self._lock:
            full: dict[float, list[str]] = defaultdict(list)  # lo -> names to read whole
            more: dict[float, list[str]] = defaultdict(list)  # fetched_to -> names to extend
            for name, start in starts.items():
                lo = start - ANCHOR_S
                entry = self._entries.get((instance_id, host_id, name))
                if (
                    entry is None
                    or lo < entry.fetched_from
                    or end - entry.full_at > self.full_refresh_s
                    or end < entry.fetched_to
                ):
                    full[lo].append(name)
                elif end > entry.fetched_to:
                    more[entry.fetched_to].append(name)
            for lo, names in full.items():
                found = self._read(names, lo, end, instance_id, host_id)
                for name in names:
                    entry = _Entry(fetched_from=lo, fetched_to=end, full_at=end)
                    self.rows_read += entry.add(found[name])
                    self._entries[(instance_id, host_id, name)] = entry
            for since, names in more.items():
                found = self._read(names, since, end, instance_id, host_id)
                for name in names:
                    entry = self._entries[(instance_id, host_id, name)]
                    self.rows_read += entry.add(found[name])
                    entry.fetched_to = end
            out: dict[str, list[Series]] = {}
            for name, start in starts.items():
                entry = self._entries[(instance_id, host_id, name)]
                entry.trim(start - ANCHOR_S)
                out[name] = entry.view(end)
            return out

    def _read(
        self, names: list[str], lo: float, end: float, instance_id: int | None, host_id: int | None
    ) -> dict[str, list[TieredSeries]]:
        self.queries += 1
        found = read_series(self.engine, SeriesQuery(names, lo, end, instance_id=instance_id, host_id=host_id))
        return by_name(found, names)

    def forget(self) -> None:
        with self._lock:
            self._entries.clear()
