"""The data model of a chart panel and the fetcher that reads its series from the right tier."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from app.derived.evaluate import Values
from app.derived.grid import Grid, make_grid
from app.storage.rollups import DEFAULT_PX, TieredSeries, pick_tier, scrape_gap, tiered_points


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
    instance: dict[str, Any]
    grid: Grid
    now: float
    state: str  # up | down | restarting | stale
    lookback: float
    _cache: dict[tuple[bool, str], list[TieredSeries]] = field(default_factory=dict)
    _lean_cache: dict[str, list[TieredSeries]] = field(default_factory=dict)

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

    def _read(self, names: list[str], host: bool, lean: bool) -> dict[str, list[TieredSeries]]:
        found = tiered_points(
            self.engine, names=names, start=self.grid.start, end=self.grid.end, tier=self.grid.tier,
            instance_id=None if host else self.instance_id, host_id=self.host_id if host else None,
            lookback=self.lookback, lean=lean,
        )
        by: dict[str, list[TieredSeries]] = defaultdict(list)
        for s in found:
            by[s.name].append(s)
        return by


def make_scope(
    engine: Engine, instance: dict[str, Any], *, start: float, end: float, now: float, state: str,
    raw_retention_s: float, px: int = DEFAULT_PX, tier: str | None = None,
) -> Scope:
    chosen = tier or pick_tier(start, end, now, raw_retention_s, px)
    gap = scrape_gap(engine, int(instance["id"]), start, end) if chosen == "raw" else None
    grid = make_grid(start, end, chosen, px, gap)
    # raw rates look back one window; rollups one step
    lookback = grid.rate_window + 1.0 if chosen == "raw" else grid.step
    return Scope(engine=engine, instance=instance, grid=grid, now=now, state=state, lookback=lookback)


def offload_size_bytes(instance: dict[str, Any]) -> float | None:
    """Configured CPU offload size: kv_offloading_size (GiB, "None" when off) of cache_config_info."""
    raw = (instance.get("cache_config") or {}).get("kv_offloading_size")
    if raw is None or str(raw).strip() in ("", "None", "none", "0", "0.0"):
        return None
    try:
        gib = float(raw)
    except ValueError:
        return None
    return gib * 2**30 if gib > 0 else None


def offload_capacity_bytes(instance: dict[str, Any]) -> float | None:
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
