"""The one cache of stored series: raw points kept per series under the reader
(app.derived.series_reader reads the raw tier through it; rollup tiers are read as they are).

Each series' entry holds its points over [from, known], where `known` is the newest point it
read: every point storage holds in that span is in the entry, as long as the series' write
generation is the one read with it. A read then fetches from storage only what lies after
`known` (and before `from`, if it starts earlier), and gives exactly what a direct read of
storage gives:
- an append (a sample newer than the series' newest) lands after `known`: the next read fetches it;
- any other write (a late or replayed sample, through this app process or another) moves the
  series' write generation (app/storage/series_generation.py), read with the series before its
  points: an entry of another generation is dropped and read again;
- raw retention and the disk budget delete only samples before a watermark they record first:
  points before it are never served from here, but read from storage every time.
No time-to-live: nothing here goes stale by time. Bounded: at most `max_points` points in all
(least recently read series go first; a read whose series do not fit together is not kept, nor
are the entries it read extended), series not read for
`idle_s` are dropped, and points before every recent read's start are trimmed every `sweep_s`.
Thread-safe: the plan (what to fetch) and the merge happen under a lock, the storage read
between them does not; an entry another read changed in between is left as that read left it.

Result caches sit above the reader and keep finished computations, not points: the
dashboard's fragment results per quantised now (app.dashboard.chart_cache.ResultCache), the
live memo of final grid values (app.derived.live, valid per write generation) and the
Prometheus source's results (app.export.prometheus_source).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine

from app.derived.series_types import Point
from app.storage.raw_store import SeriesMeta, raw_points_ms

MAX_POINTS = 2_000_000  # ~110 bytes each (a tuple of two floats and its list slot): ~220 MB at most
IDLE_S = 120.0  # a series not read this long is dropped
SWEEP_S = 60.0  # how often idle series are dropped and points before recent reads' starts trimmed
_MIN = -(2**62)
_T = itemgetter(0)


@dataclass
class _Entry:
    gen: int
    from_ms: int
    known_ms: int  # the newest point held (from_ms - 1 when none): storage's points in [from_ms, known_ms] are here
    points: list[Point]
    used: float  # clock() of the last read
    lo_now: int  # the earliest start read since the last sweep
    lo_prev: int  # ... in the sweep period before


class _Plan(NamedTuple):
    entry: _Entry | None  # the entry read from (None: a fresh read)
    seen: _Entry | None  # a fresh read: the entry it found (replaced only if still there)
    lo_ms: int  # what the cache part of the read starts from (at or after the watermark)
    cached: list[Point]  # the entry's points the read uses
    pre: tuple[int, int] | None  # to fetch before the entry
    suf: tuple[int, int] | None  # to fetch after it (a fresh read: all of it)
    install: bool  # a fresh read may replace the series' entry


class SeriesCache:
    """Raw points per series of one database (one per engine: `cache_for`)."""

    def __init__(
        self,
        *,
        max_points: int = MAX_POINTS,
        idle_s: float = IDLE_S,
        sweep_s: float = SWEEP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_points = max_points
        self.idle_s = idle_s
        self.sweep_s = sweep_s
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._size = 0
        self._swept = clock()
        self.points_read = 0  # points fetched from storage (tests, benchmarks)
        self.points_served = 0

    @property
    def size(self) -> int:
        """Points held, all series together."""
        return self._size

    def held(self, series_id: int) -> tuple[int, int, int] | None:
        """(from_ms, known_ms, points) held for a series, or None (tests)."""
        with self._lock:
            e = self._entries.get(series_id)
            return None if e is None else (e.from_ms, e.known_ms, len(e.points))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._size = 0

    def read(
        self,
        conn: Connection,
        metas: Sequence[SeriesMeta],
        starts: Mapping[int, float],
        end: float,
        kept_from_ms: int | None,
    ) -> dict[int, list[Point]]:
        """Raw points of each series of `metas` over [starts[id], end], ascending: what
        raw_store.raw_points_from gives on `conn`. The metas must be read before (their
        write_gen is what the points are checked against); `kept_from_ms` is the raw watermark."""
        hi = int(end * 1000)
        kept = _MIN if kept_from_ms is None else kept_from_ms
        direct: dict[int, tuple[int, int]] = {}  # before the watermark: from storage, every time
        plans: dict[int, _Plan] = {}
        now = self.clock()
        with self._lock:
            if now - self._swept >= self.sweep_s:
                self._sweep(now)
            for m in metas:
                lo = int(starts[m.id] * 1000)
                if lo < kept:
                    direct[m.id] = (lo, min(hi, kept - 1))
                plan = self._plan(m, max(lo, kept), hi, kept, now)
                if plan is not None:
                    plans[m.id] = plan
        before = raw_points_ms(conn, direct) if direct else {}
        pre = raw_points_ms(conn, {sid: p.pre for sid, p in plans.items() if p.pre is not None})
        suf = raw_points_ms(conn, {sid: p.suf for sid, p in plans.items() if p.suf is not None})
        out: dict[int, list[Point]] = {}
        # a read whose series would not all fit is served and not kept: keeping it would only
        # evict its own first series (and whatever else there was) before the next read
        fits = (
            sum(len(p.entry.points) if p.entry is not None else 0 for p in plans.values())
            + sum(len(v) for v in pre.values())
            + sum(len(v) for v in suf.values())
            <= self.max_points
        )
        with self._lock:
            for m in metas:
                sid = m.id
                plan = plans.get(sid)
                got_pre, got_suf = pre.get(sid, []), suf.get(sid, [])
                self.points_read += len(got_pre) + len(got_suf)
                points = plan.cached if plan is not None else []  # a slice: this read's own list
                if got_pre:
                    points[:0] = got_pre
                if got_suf:
                    points.extend(got_suf)
                if plan is not None and fits:
                    self._merge(sid, m.write_gen, plan, got_pre, got_suf, now)
                head = before.get(sid)
                out[sid] = head + points if head else points
                self.points_served += len(out[sid])
            self._bound()
        return out

    # ------------------------------------------------------------------ under the lock
    def _plan(self, m: SeriesMeta, lo: int, hi: int, kept: int, now: float) -> _Plan | None:
        if lo > hi:
            return None  # the whole range is before the watermark
        e = self._entries.get(m.id)
        if e is not None and e.gen != m.write_gen:
            self._drop(m.id)  # a late write since: what it holds may miss points
            e = None
        if e is not None and e.from_ms < kept:
            self._trim(e, kept)
        if e is None or lo > e.known_ms + 1:  # nothing held, or only before the range
            return _Plan(None, e, lo, [], None, (lo, hi), True)
        if hi < e.from_ms:  # a range wholly before what is held: read it, keep the entry
            return _Plan(None, e, lo, [], None, (lo, hi), False)
        e.used = now
        e.lo_now = min(e.lo_now, lo)
        self._entries.move_to_end(m.id)
        pts = e.points
        i = bisect_left(pts, max(lo, e.from_ms) / 1000.0, key=_T) if lo > e.from_ms else 0
        j = bisect_right(pts, hi / 1000.0, key=_T) if hi < e.known_ms else len(pts)
        pre = (lo, e.from_ms - 1) if lo < e.from_ms else None
        suf = (e.known_ms + 1, hi) if hi > e.known_ms else None
        return _Plan(e, e, lo, pts[i:j], pre, suf, False)

    def _merge(self, sid: int, gen: int, plan: _Plan, got_pre: list[Point], got_suf: list[Point], now: float) -> None:
        cur = self._entries.get(sid)
        e = plan.entry
        if e is None:
            if not plan.install or cur is not plan.seen:
                return  # a historical read, or another read changed the entry meanwhile
            if cur is not None:
                self._drop(sid)
            lo = plan.suf[0] if plan.suf is not None else plan.lo_ms
            known = _ms(got_suf[-1][0]) if got_suf else lo - 1
            self._entries[sid] = _Entry(gen, lo, known, list(got_suf), now, lo, lo)
            self._size += len(got_suf)
            return
        if cur is not e or e.gen != gen:
            return  # dropped or replaced meanwhile
        if plan.pre is not None and e.from_ms == plan.pre[1] + 1:
            e.points[:0] = got_pre
            e.from_ms = plan.pre[0]
            self._size += len(got_pre)
        if plan.suf is not None and e.known_ms == plan.suf[0] - 1 and got_suf:
            e.points.extend(got_suf)
            e.known_ms = _ms(got_suf[-1][0])
            self._size += len(got_suf)

    def _trim(self, e: _Entry, lo: int) -> None:
        """Forget the entry's points before `lo` (ms)."""
        if lo <= e.from_ms:
            return
        cut = bisect_left(e.points, lo / 1000.0, key=_T)
        if cut:
            del e.points[:cut]
            self._size -= cut
        e.from_ms = lo
        e.known_ms = max(e.known_ms, lo - 1)

    def _drop(self, sid: int) -> None:
        e = self._entries.pop(sid, None)
        if e is not None:
            self._size -= len(e.points)

    def _bound(self) -> None:
        while self._size > self.max_points and self._entries:
            sid = next(iter(self._entries))  # the least recently read
            self._drop(sid)

    def _sweep(self, now: float) -> None:
        """Drop series not read for idle_s; trim each one's points before its recent reads' starts."""
        self._swept = now
        for sid, e in list(self._entries.items()):
            if now - e.used > self.idle_s:
                self._drop(sid)
                continue
            floor = min(e.lo_now, e.lo_prev)
            if floor >= 2**62:  # not read for two sweeps
                self._drop(sid)
                continue
            self._trim(e, floor)
            e.lo_prev, e.lo_now = e.lo_now, 2**62


def _ms(ts: float) -> int:
    return round(ts * 1000)


_CACHES: WeakKeyDictionary[Engine, SeriesCache] = WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def cache_for(engine: Engine) -> SeriesCache:
    """The series cache of a database: one per engine (so one per app process and database)."""
    with _CACHES_LOCK:
        got = _CACHES.get(engine)
        if got is None:
            got = _CACHES[engine] = SeriesCache()
        return got
