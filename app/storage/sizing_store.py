"""Cache-sizing windows: stored from pushes, read back per instance and range."""

from __future__ import annotations

from typing import Any, TypedDict, cast

from sqlalchemy import Engine, Table, delete, func, insert, select

from app.storage.models import Instance
from app.storage.rows import typed_row
from app.storage.sizing_models import SizingWindow
from kvcore.protocol import ReuseWindow

COUNT_FIELDS = (
    "references",
    "sampled",
    "cold",
    "reannounced",
    "stored_tokens",
    "messages",
    "events",
    "lost",
    "garbage",
    "epochs",
    "tier_stored",
    "tier_removed",
    "tracked_keys",
    "duplicates",
    "stale_messages",
    "stale_tokens",
    "other_group_blocks",
    "kv_groups",
    "first_ts",
    "last_ts",
    "points",
    "arc_points",
)
MAX_WINDOWS_READ = 200_000  # a range is read whole; a year of 1 s pushes is less than this x 160


class SizingWindowRow(TypedDict):
    """One stored ReuseWindow as windows_in reads it back (app/sizing/curve.py adds them)."""

    start_ts: float
    end_ts: float
    block_size: int | None
    rate: float  # sampling rate of the window's reuse distances
    counts: dict[str, Any]  # JSON: COUNT_FIELDS -> count, as pushed
    bins: list[Any]  # JSON: [[lower edge in blocks, weight], ...]


def store_windows(engine: Engine, host_id: int, windows: list[ReuseWindow], now: float) -> int:
    """Rows for the windows of instances this host has; windows of unknown instances are dropped."""
    if not windows:
        return 0
    inst = cast(Table, Instance.__table__)
    tbl = cast(Table, SizingWindow.__table__)
    with engine.begin() as conn:
        ids = {
            url: iid
            for iid, url in conn.execute(
                select(inst.c.id, inst.c.url).where(
                    inst.c.host_id == host_id, inst.c.url.in_({w.instance for w in windows})
                )
            )
        }
        rows = [
            {
                "instance_id": ids[w.instance],
                "start_ts": w.start,
                "end_ts": w.end,
                "block_size": w.block_size,
                "rate": w.rate,
                # pool_bins rides in the counts JSON: the GPU-pool levers' eviction distances
                "counts": {f: getattr(w, f) for f in COUNT_FIELDS}
                | ({"pool_bins": [[float(lo), float(n)] for lo, n in w.pool_bins]} if w.pool_bins else {})
                # the optimal-eviction bound rides there too (a snapshot the app reads the latest of)
                | (
                    {"opt_bound": [[float(x) for x in p] for p in w.opt_bound], "opt_accesses": w.opt_accesses}
                    if w.opt_bound
                    else {}
                ),
                "bins": [[float(lo), float(wt)] for lo, wt in w.bins],
                "received_at": now,
            }
            for w in windows
            if w.instance in ids
        ]
        if rows:
            conn.execute(insert(tbl), rows)
    return len(rows)


def windows_in(engine: Engine, instance_id: int, start: float, end: float) -> list[SizingWindowRow]:
    """Windows that ended in (start, end], oldest first."""
    tbl = cast(Table, SizingWindow.__table__)
    q = (
        select(tbl.c.start_ts, tbl.c.end_ts, tbl.c.block_size, tbl.c.rate, tbl.c.counts, tbl.c.bins)
        .where(tbl.c.instance_id == instance_id, tbl.c.end_ts > start, tbl.c.end_ts <= end)
        .order_by(tbl.c.end_ts)
        .limit(MAX_WINDOWS_READ)
    )
    with engine.connect() as conn:
        return [typed_row(SizingWindowRow, r._mapping) for r in conn.execute(q)]


def last_window_end(engine: Engine, instance_id: int) -> float | None:
    """When the instance's newest window ended (None: none kept); one index seek."""
    tbl = cast(Table, SizingWindow.__table__)
    with engine.connect() as conn:
        v = conn.execute(select(func.max(tbl.c.end_ts)).where(tbl.c.instance_id == instance_id)).scalar()
    return None if v is None else float(v)


def prune_windows(engine: Engine, older_than: float) -> int:
    tbl = cast(Table, SizingWindow.__table__)
    with engine.begin() as conn:
        return conn.execute(delete(tbl).where(tbl.c.end_ts < older_than)).rowcount or 0
