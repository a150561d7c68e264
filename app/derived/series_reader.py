"""The one way to read a series' points: a SeriesQuery in, TieredSeries out.

Every consumer of stored points reads them here: the charts (app.derived.panels), the alert
evaluator's cache, the exporter, the controller's preflight, A/B, sizing and the JSON API. The
tier policy lives here too: `pick_tier` chooses raw samples or 1-minute / 1-hour rollup buckets
from the resolution a plot can show and the raw retention. Storage answers only primitives
(app.storage.raw_store: series metadata, raw points in a range; app.storage.rollups: rollup
buckets in a range) and decides nothing.

Raw points are read through the one series cache (app.derived.series_cache): a read fetches
from storage only the points after what it holds for a series, exactly what storage holds as
long as the series' write generation (read with the series, before the points) has not moved.

Live reads (a chart of a named range ending now, redrawn every 15 s) read each raw series only
from where its memoised final values end (app.derived.live, valid per write generation) and
come back as LiveRawSeries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from sqlalchemy import Connection, Engine

from app.derived.live import LiveHandle, LiveRawSeries, LiveValues
from app.derived.series_cache import cache_for
from app.derived.series_types import Point
from app.derived.series_types import TieredSeries as TieredSeries  # the reader's result type
from app.storage.raw_store import SeriesMeta, series_meta
from app.storage.rollups import rollup_buckets
from app.storage.series_generation import RawWatermarks, raw_watermarks

TIER_RES = {"raw": 0.0, "1m": 60.0, "1h": 3600.0}  # seconds per bucket (raw: points as scraped)
DEFAULT_PX = 1600
# A tier is used when it still gives at least this many points per pixel column.
MIN_POINTS_PER_PX = 1 / 3


def pick_tier(start: float, end: float, now: float, raw_retention_s: float, px: int = DEFAULT_PX) -> str:
    """The coarsest tier that still gives about one point per pixel column (at least px/3 points);
    raw when the range is short, or when it is recent enough that rollups may lag behind."""
    span = end - start
    for tier in ("1h", "1m"):
        if span / TIER_RES[tier] >= px * MIN_POINTS_PER_PX:
            return tier
    if start < now - raw_retention_s:
        return "1m"  # raw is gone there
    return "raw"


@dataclass(frozen=True, eq=False)
class LiveRead:
    """Read raw series through the live memo: `values` keeps final values per series for grids of
    `step` and rate `window` (valid while the series' write generation holds); `now` says which
    instants are final."""

    values: LiveValues
    step: float
    window: float
    now: float


@dataclass(frozen=True, eq=False)
class SeriesQuery:
    """Every series named in `names` of one target, over [start - lookback, end].

    Target: the series of an instance (instance_id), the host-level series of a host (host_id),
    or, with everywhere=True, those of every instance and host (raw tier only: the exporter).
    tier: raw | 1m | 1h, or auto (pick_tier from `now`, `raw_retention_s` and `px`).
    lean: rollup buckets carry only the increase (enough for rates and quantiles; min/max/mean/
    last are 0), and only whole buckets (the one still filling at `end` is left out).
    live: raw series read incrementally through the live memo (ignored on rollup tiers)."""

    names: Sequence[str]
    start: float
    end: float
    instance_id: int | None = None
    host_id: int | None = None
    everywhere: bool = False
    lookback: float = 0.0
    tier: str = "raw"
    lean: bool = False
    now: float | None = None
    raw_retention_s: float | None = None
    px: int = DEFAULT_PX
    live: LiveRead | None = None

    def chosen_tier(self) -> str:
        if self.tier == "auto":
            if self.now is None or self.raw_retention_s is None:
                raise ValueError("tier auto needs now and raw_retention_s")
            return pick_tier(self.start, self.end, self.now, self.raw_retention_s, self.px)
        if self.tier not in TIER_RES:
            raise ValueError(f"unknown tier {self.tier!r}")
        return self.tier


def read_series(engine: Engine, q: SeriesQuery) -> list[TieredSeries]:
    """The series of `q` ascending by id, each with its points (or buckets) in the range; a series
    without any there comes back empty. One query for the series (with their write generations),
    then the points: raw ones through the series cache (only what it does not hold yet), or the
    rollup tables and their raw tail."""
    with engine.connect() as conn:  # the series and their points: one checkout
        marks: list[RawWatermarks] = []
        tier = _tier(conn, q, marks)
        if q.everywhere and (tier != "raw" or q.live is not None):
            raise ValueError("everywhere reads the raw tier only")
        metas = series_meta(conn, q.names, instance_id=q.instance_id, host_id=q.host_id, everywhere=q.everywhere)
        if not metas:
            return []
        lo = q.start - q.lookback
        if tier == "raw":
            kept = (marks[0] if marks else raw_watermarks(conn)).kept_from_ms
            if q.live is not None:
                return _read_live(engine, conn, q, q.live, metas, kept)
            points = cache_for(engine).read(conn, metas, dict.fromkeys((m.id for m in metas), lo), q.end, kept)
            return [
                TieredSeries(
                    m.id,
                    m.name,
                    m.labels,
                    m.kind,
                    "raw",
                    0.0,
                    points.get(m.id, []),
                    [],
                    m.host_id,
                    m.instance_id,
                    m.write_gen,
                )
                for m in metas
            ]
        counters = {m.id for m in metas if m.kind == "counter"}
        buckets = rollup_buckets(conn, [m.id for m in metas], counters, tier, lo, q.end, lean=q.lean)
    res = TIER_RES[tier]
    return [
        TieredSeries(m.id, m.name, m.labels, m.kind, tier, res, [], buckets[m.id], m.host_id, m.instance_id)
        for m in metas
    ]


def _tier(conn: Connection, q: SeriesQuery, marks: list[RawWatermarks]) -> str:
    """The query's tier; with tier auto, raw samples the disk budget dropped (before the raw
    retention would have) count as gone, so such ranges read rollups. The watermarks read for
    it are appended to `marks`."""
    if q.tier == "auto" and q.now is not None and q.raw_retention_s is not None:
        marks.append(raw_watermarks(conn))
        cut = marks[0].budget_cut_ms
        if cut is not None and q.now - cut / 1000.0 < q.raw_retention_s:
            return pick_tier(q.start, q.end, q.now, max(0.0, q.now - cut / 1000.0), q.px)
    return q.chosen_tier()


def by_name(series: Iterable[TieredSeries], names: Iterable[str] = ()) -> dict[str, list[TieredSeries]]:
    """Series grouped by name (every one of `names` present, maybe empty), in the order read."""
    out: dict[str, list[TieredSeries]] = {n: [] for n in names}
    for s in series:
        out.setdefault(s.name, []).append(s)
    return out


def _read_live(
    engine: Engine, conn: Connection, q: SeriesQuery, live: LiveRead, metas: list[SeriesMeta], kept: int | None
) -> list[TieredSeries]:
    """Raw series with only the points past their memoised final values (see app.derived.live),
    read on `conn`; a series' full points, when a computation needs them, later from `engine`
    (both through the series cache)."""
    memo = live.values
    full_lo = q.start - q.lookback
    finals = {m.id: memo.final_until(m.id, live.step, live.window, m.write_gen) for m in metas}
    cold = all(f is None for f in finals.values())
    # a series without final values is read in full with the others when all are cold (a first
    # view), else only if something evaluates it (charts fetch series they may not plot)
    starts = {
        sid: (full_lo if cold else math.inf) if f is None else max(full_lo, f + live.step - q.lookback)
        for sid, f in finals.items()
    }
    reading = [m for m in metas if starts[m.id] < math.inf]
    points = cache_for(engine).read(conn, reading, starts, q.end, kept) if reading else {}
    out: list[TieredSeries] = []
    for m in metas:
        sid = m.id
        tail = points.get(sid, [])
        handle = LiveHandle(
            memo,
            m.write_gen,
            starts[sid],
            live.now,
            tail,
            load_full=partial(_points_of, engine, m, full_lo, q.end, kept),
        )
        if starts[sid] <= full_lo:
            handle._full = tail
        out.append(
            LiveRawSeries(
                sid,
                m.name,
                m.labels,
                m.kind,
                "raw",
                0.0,
                tail,
                [],
                m.host_id,
                m.instance_id,
                m.write_gen,
                handle=handle,
            )
        )
    return out


def _points_of(engine: Engine, meta: SeriesMeta, start: float, end: float, kept: int | None) -> list[Point]:
    """A live series' full points, with the watermark read with its tail (a moment ago)."""
    with engine.connect() as conn:
        return cache_for(engine).read(conn, [meta], {meta.id: start}, end, kept)[meta.id]
