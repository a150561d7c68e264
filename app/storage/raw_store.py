"""Raw-sample primitives (what to read is decided above, in app.derived.series_reader): series
metadata alone, points from a per-series start time (a live refresh reads only what it has not
seen yet), points of named series of every instance at once, and reset-corrected counter
increases computed by the database (window functions on PostgreSQL; on SQLite, folding the values
read through the driver is three times faster than its window functions).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from sqlalchemy import Connection, Engine, bindparam, select, text

from app.storage.models import SampleRow, Series
from kvcore.series import increase_of_values

Point = tuple[float, float]  # (ts seconds, value)


@contextmanager
def connected(bind: Engine | Connection) -> Iterator[Connection]:
    """`bind` itself when it is a connection (a reader's several reads share one checkout and one
    snapshot), else a connection of the engine for this read."""
    if isinstance(bind, Connection):
        yield bind
        return
    with bind.connect() as conn:
        yield conn


class SeriesMeta(NamedTuple):
    id: int
    name: str
    labels: dict[str, str]
    kind: str  # counter | gauge | ...
    host_id: int
    instance_id: int | None  # None: a host-level series


def series_meta(
    engine: Engine | Connection,
    names: Sequence[str],
    *,
    instance_id: int | None = None,
    host_id: int | None = None,
    everywhere: bool = False,
) -> list[SeriesMeta]:
    """Every series named in `names` of one instance, or the host-level series (instance_id NULL)
    of one host, or with `everywhere` those of every instance and host; ascending by id."""
    s = Series.__table__
    q = select(s.c.id, s.c.name, s.c.labels, s.c.kind, s.c.host_id, s.c.instance_id).where(s.c.name.in_(list(names)))
    if everywhere:
        if instance_id is not None or host_id is not None:
            raise ValueError("everywhere or one target, not both")
    elif instance_id is not None:
        q = q.where(s.c.instance_id == instance_id)
    elif host_id is not None:
        q = q.where(s.c.host_id == host_id, s.c.instance_id.is_(None))
    else:
        raise ValueError("instance_id or host_id is required")
    with connected(engine) as conn:
        rows = conn.execute(q).all()
    return sorted(
        SeriesMeta(int(sid), str(name), dict(labels or {}), str(kind), int(host), None if inst is None else int(inst))
        for sid, name, labels, kind, host, inst in rows
    )


def raw_points_from(engine: Engine | Connection, starts: Mapping[int, float], end: float) -> dict[int, list[Point]]:
    """Raw points of each series in `starts` over [its start, end], ascending; one query per
    distinct start (the series of one chart usually share theirs)."""
    hi = int(end * 1000)
    out: dict[int, list[Point]] = {sid: [] for sid in starts}
    t = SampleRow.__table__
    with connected(engine) as conn:
        if conn.dialect.name == "sqlite":
            # the hot read: one primary-key range scan per series through the driver's cursor; rows
            # come back as (seconds, value) tuples built in C (SQLite divides: the same IEEE result)
            cur = conn.connection.cursor()
            try:
                sql = (
                    "SELECT ts_ms / 1000.0, value FROM samples "
                    "WHERE series_id = ? AND ts_ms >= ? AND ts_ms <= ? ORDER BY ts_ms"
                )
                for sid, start in starts.items():
                    out[sid] = cur.execute(sql, (sid, int(start * 1000), hi)).fetchall()
            finally:
                cur.close()
            return out
        by_start: dict[int, list[int]] = {}
        for sid, start in starts.items():
            by_start.setdefault(int(start * 1000), []).append(sid)
        for lo, ids in by_start.items():
            q = (
                t.select()
                .with_only_columns(t.c.series_id, t.c.ts_ms, t.c.value)
                .where(t.c.series_id.in_(ids), t.c.ts_ms >= lo, t.c.ts_ms <= hi)
                .order_by(t.c.series_id, t.c.ts_ms)
            )
            for sid, ts, v in conn.execute(q).all():
                out[int(sid)].append((ts / 1000.0, float(v)))
    return out


def raw_points_named(
    engine: Engine | Connection, names: Sequence[str], start: float, end: float
) -> dict[int, list[Point]]:
    """Raw points over [start, end] of every series named in `names`, of every instance and host,
    ascending; in one query however many instances there are (series without points are absent)."""
    s = Series.__table__
    q = (
        select(SampleRow.series_id, SampleRow.ts_ms, SampleRow.value)
        .join(s, s.c.id == SampleRow.series_id)
        .where(s.c.name.in_(list(names)), SampleRow.ts_ms >= int(start * 1000), SampleRow.ts_ms <= int(end * 1000))
        .order_by(SampleRow.series_id, SampleRow.ts_ms)
    )
    out: dict[int, list[Point]] = {}
    with connected(engine) as conn:
        for sid, ts, v in conn.execute(q):
            out.setdefault(int(sid), []).append((ts / 1000.0, float(v)))
    return out


_INCREASES = text("""
SELECT series_id, SUM(CASE WHEN prev IS NULL THEN 0.0 WHEN value >= prev THEN value - prev ELSE value END)
FROM (
    SELECT series_id, ts_ms, value, LAG(value) OVER (PARTITION BY series_id ORDER BY ts_ms) AS prev
    FROM (
        SELECT series_id, ts_ms, value FROM samples WHERE series_id IN :ids AND ts_ms >= :lo AND ts_ms <= :hi
        UNION ALL
        SELECT b.series_id, b.ts_ms, b.value FROM series AS x CROSS JOIN LATERAL (
            SELECT series_id, ts_ms, value FROM samples
            WHERE series_id = x.id AND ts_ms < :lo ORDER BY ts_ms DESC LIMIT 1
        ) AS b
        WHERE x.id IN :ids
    ) AS window_and_before
) AS steps
GROUP BY series_id
HAVING MAX(ts_ms) >= :lo
""").bindparams(bindparam("ids", expanding=True))


def counter_increases(engine: Engine, ids: Sequence[int], start: float, end: float) -> dict[int, float]:
    """Reset-corrected increase of each counter over [start, end], counted from the last sample
    before start (as PromQL's increase over adjacent windows and the rollup buckets do: traffic
    between that sample and the first one inside belongs to the window). A decrease is a restart:
    the new value is all increase, as kvcore.series.increase computes it. Series with no point in
    [start, end] are absent; one point and nothing before it gives 0."""
    if not ids:
        return {}
    lo, hi = int(start * 1000), int(end * 1000)
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":  # SQLite's window functions are slower than folding here
            out: dict[int, float] = {}
            cur = conn.connection.cursor()
            try:
                sql = "SELECT value FROM samples WHERE series_id = ? AND ts_ms >= ? AND ts_ms <= ? ORDER BY ts_ms"
                before = "SELECT value FROM samples WHERE series_id = ? AND ts_ms < ? ORDER BY ts_ms DESC LIMIT 1"
                for sid in ids:
                    values = [v for (v,) in cur.execute(sql, (sid, lo, hi))]
                    if values:
                        values[:0] = [v for (v,) in cur.execute(before, (sid, lo))]
                        out[int(sid)] = increase_of_values(values)
            finally:
                cur.close()
            return out
        rows = conn.execute(_INCREASES, {"ids": list(ids), "lo": lo, "hi": hi}).all()
    return {int(sid): float(inc or 0.0) for sid, inc in rows}
