"""The data model of a chart panel and the scope its charts read their series through
(app.derived.series_reader, on the tier the range needs)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from app.derived.grid import Grid, make_grid
from app.derived.grid_math import gauge_window, range_increase
from app.derived.live import LiveValues
from app.derived.series_reader import DEFAULT_PX, LiveRead, SeriesQuery, TieredSeries, by_name, pick_tier, read_series
from app.storage.raw_store import counter_increases, series_meta
from app.storage.rollouts_store import list_rollouts
from app.storage.rollups import scrape_gap
from app.storage.series_store import InstanceRow
from kvcore import kv_vocabulary as kv
from kvcore.series import Values

Increase = tuple[dict[str, Any], float]  # (labels, increase) of one series


@dataclass
class Trace:
    name: str
    y: Values
    unit: str
    row: int = 0  # which stacked sub-plot (0 = top)
    style: str = "line"  # line | area (stacked) | dash | dot
    color: str | None = None
    derived: bool = False  # computed by kvscope, not read from vLLM
    group: str | None = None  # stack group for style=area


@dataclass
class Panel:
    key: str
    title: str
    grid: Grid
    rows: list[str]  # y-axis title (with unit) per sub-plot row
    traces: list[Trace] = field(default_factory=list)
    empty: str | None = None  # why there is nothing to plot
    notes: list[str] = field(default_factory=list)
    hlines: list[tuple[int, float, str]] = field(default_factory=list)  # (row, y, label)
    y_ranges: dict[int, tuple[float, float]] = field(default_factory=dict)

    def has_data(self) -> bool:
        return any(v is not None for t in self.traces for v in t.y)


@dataclass
class Scope:
    """Everything a panel needs: the instance row, its host, the grid and a series fetcher."""

    engine: Engine
    instance: InstanceRow
    grid: Grid
    now: float
    state: str  # up | down | restarting | stale | gone (app.derived.fleet.instance_state)
    lookback: float
    live: LiveValues | None = None  # raw tier: reuse final values of earlier refreshes (pages)
    raw_since: float | None = None  # raw samples are kept from here on (range increases read them)
    _cache: dict[tuple[bool, str], list[TieredSeries]] = field(default_factory=dict)
    _lean_cache: dict[str, list[TieredSeries]] = field(default_factory=dict)
    _tiers: list[str] | None = None

    @property
    def instance_id(self) -> int:
        return int(self.instance["id"])

    @property
    def host_id(self) -> int:
        return int(self.instance["host_id"])

    def fetch(self, names: list[str], host: bool = False) -> dict[str, list[TieredSeries]]:
        """Series by name: instance-level, or host-level with host=True."""
        missing = [n for n in names if (host, n) not in self._cache]
        if missing:
            by = self._read(missing, host, lean=False)
            for n in missing:
                self._cache[(host, n)] = by.get(n, [])
        return {n: self._cache[(host, n)] for n in names}

    def fetch_counters(self, names: list[str]) -> dict[str, list[TieredSeries]]:
        """Instance counters of which only rates are needed (histogram buckets): from rollup
        tiers, buckets without min/max/mean/last, a cheaper read. A subclass that reads series
        elsewhere (overrides fetch) is used as it is."""
        if type(self).fetch is not Scope.fetch:
            return self.fetch(names)
        missing = [n for n in names if n not in self._lean_cache]
        if missing:
            by = self._read(missing, False, lean=True)
            for n in missing:
                self._lean_cache[n] = by.get(n, [])
        return {n: self._lean_cache[n] for n in names}

    def range_increases(self, names: list[str], start: float, end: float) -> dict[str, list[Increase]]:
        """Reset-corrected increase over [start, end] of each instance counter named, with its
        labels, counted from the last sample before start, exact at any window edge:
        - raw charts (live, or within raw retention): the database folds the raw samples;
        - rollup charts within raw retention: the whole buckets inside the range (each counted
          from the sample before it) plus the two edge fragments folded from raw samples, so a
          long range reads minutes of raw samples, not hours;
        - beyond raw retention: the whole buckets inside the range (the edges' partial buckets
          cannot be split)."""
        in_raw = self.raw_since is not None and start >= self.raw_since
        if self.grid.tier == "raw" and (self.live is not None or in_raw):
            return self._db_increases(names, start, end)
        got = self.fetch(names)
        if not in_raw:
            return {n: [(s.labels, range_increase(s, start, end)) for s in got[n]] for n in names}
        res = self.grid.res
        lo, hi = math.ceil(start / res) * res, math.floor(end / res) * res
        if hi <= lo:
            return self._db_increases(names, start, end)
        ids = [s.series_id for n in names for s in got[n]]
        head = counter_increases(self.engine, ids, start, lo - 0.001) if lo > start else {}
        tail = counter_increases(self.engine, ids, hi, end)
        return {
            n: [
                (s.labels, head.get(s.series_id, 0.0) + range_increase(s, lo, hi) + tail.get(s.series_id, 0.0))
                for s in got[n]
            ]
            for n in names
        }

    def _db_increases(self, names: list[str], start: float, end: float) -> dict[str, list[Increase]]:
        metas = series_meta(self.engine, names, instance_id=self.instance_id)
        incs = counter_increases(self.engine, [m.id for m in metas], start, end)
        out: dict[str, list[Increase]] = {n: [] for n in names}
        for m in metas:
            out[m.name].append((m.labels, incs.get(m.id, 0.0)))
        return out

    def _read(self, names: list[str], host: bool, lean: bool) -> dict[str, list[TieredSeries]]:
        g = self.grid
        q = SeriesQuery(
            names,
            g.start,
            g.end,
            instance_id=None if host else self.instance_id,
            host_id=self.host_id if host else None,
            lookback=self.lookback,
            tier=g.tier,
            lean=lean,
            # live: a refresh reads only the raw points past the memo's final values
            live=None if self.live is None else LiveRead(self.live, g.step, g.rate_window, self.now),
        )
        return by_name(read_series(self.engine, q))


def make_scope(
    engine: Engine,
    instance: InstanceRow,
    *,
    start: float,
    end: float,
    now: float,
    state: str,
    raw_retention_s: float,
    px: int = DEFAULT_PX,
    tier: str | None = None,
    live: LiveValues | None = None,
) -> Scope:
    chosen = tier or pick_tier(start, end, now, raw_retention_s, px)
    gap = scrape_gap(engine, int(instance["id"]), start, end) if chosen == "raw" else None
    grid = make_grid(start, end, chosen, px, gap)
    # raw: one rate window or gauge lookback (whichever is longer) before the first instant; rollups one step
    lookback = gauge_window(grid) + 1.0 if chosen == "raw" else grid.step
    return Scope(
        engine=engine,
        instance=instance,
        grid=grid,
        now=now,
        state=state,
        lookback=lookback,
        live=live,
        raw_since=now - raw_retention_s,
    )


def offload_size_bytes(instance: InstanceRow) -> float | None:
    """Configured CPU offload size: kv_offloading_size (GiB, "None" when off) of cache_config_info."""
    gib = kv.configured_offload_gib(instance.get("cache_config"))
    return gib * 2**30 if gib is not None else None


TIERING_HITS = "vllm:kv_offload_tiering_block_hits_total"
TIER_FAMILIES = [kv.CACHED_BY_SOURCE, TIERING_HITS, kv.LMCACHE_HITS]  # what tiers_from reads


def tiers_from(
    cache_config: dict[str, Any] | None, got: dict[str, list[Increase]], connector: str | None = None
) -> list[str]:
    """Offload tier names from the config, the KV connector kvscope last started the instance
    with, and the increases of CACHED_BY_SOURCE / TIERING_HITS over a range: tiers that supplied
    cached tokens in it, TieringOffloadingSpec tiers present."""
    moved = sorted({str(lab.get("source", "")) for lab, inc in got.get(kv.CACHED_BY_SOURCE, []) if inc > 0})
    tiering = sorted({str(lab.get("tier", "")) for lab, _inc in got.get(TIERING_HITS, [])})
    lmcache = bool(got.get(kv.LMCACHE_HITS))
    return kv.offload_tiers(
        cache_config, cached_sources=moved, tiering_tiers=tiering, lmcache=lmcache, connector=connector
    )


def applied_connector(engine: Engine, instance_id: int) -> str | None:
    """The kv_connector of the argv of the instance's latest healthy rollout (vLLM's metrics do
    not say which connector runs: an ExampleConnector disk store reports 'external_unspecified')."""
    for r in list_rollouts(engine, instance_id=instance_id, limit=20):
        if r.get("state") == "healthy":
            argv = (r.get("payload") or {}).get("argv") or []
            return kv.connector_from_argv(str(a) for a in argv) if isinstance(argv, list) else None
    return None


def scope_connector(scope: Any) -> str | None:
    """applied_connector of a Scope's instance (None for scopes without a database)."""
    engine = getattr(scope, "engine", None)
    if engine is None:
        return None
    return applied_connector(engine, int(scope.instance["id"]))


def offload_tiers(scope: Scope) -> list[str]:
    """The offload tiers of the instance over the scope's range, named by what they are (see
    kvcore.kv_vocabulary.offload_tiers). Memoised on the scope."""
    memo: list[str] | None = getattr(scope, "_tiers", None)
    if memo is not None:
        return memo
    g = scope.grid
    got = scope.range_increases(TIER_FAMILIES, g.start, g.end)
    tiers = tiers_from(scope.instance.get("cache_config"), got, scope_connector(scope))
    try:
        scope._tiers = tiers
    except AttributeError:
        pass
    return tiers


def offload_tier(scope: Scope) -> str | None:
    """One name for the instance's offload tiers ("CPU", "disk", "CPU + disk" ...), None if none."""
    return kv.tier_name(offload_tiers(scope))


def offload_capacity_bytes(instance: InstanceRow) -> float | None:
    """CPU-tier capacity: kv_offload_config_info chunks x bytes per chunk, else the configured size."""
    cfg = instance.get("offload_config") or {}
    try:
        chunks = float(cfg["cpu_num_chunks"])
        per = float(cfg["cpu_kv_bytes_per_chunk"])
        if chunks > 0 and per > 0:
            return chunks * per
    except (KeyError, TypeError, ValueError):
        pass
    return offload_size_bytes(instance)
