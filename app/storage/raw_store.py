"""Raw-sample primitives (what to read is decided above, in app.derived.series_reader): series
metadata alone, points from a per-series start time (a live refresh reads only what it has not
seen yet), and reset-corrected counter increases. Points come from the head and the chunks
together (app.storage.chunk_reads).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from sqlalchemy import Connection, Engine, select

from app.storage import chunk_reads
from app.storage.models import Series
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
    write_gen: int = 0  # moves when a sample older than the series' newest is written (series_generation)


def series_meta(
    engine: Engine | Connection,
    names: Sequence[str],
    *,
    instance_id: int | None = None,
    host_id: int | None = None,
    everywhere: bool = False,
) -> list[SeriesMeta]:
    """Every series named in `names` of one instance, or the host-level series (instance_id NULL)
    of one host, or with `everywhere` those of every instance and host; ascending by id. Read
    before a series' points, its write generation says whether points kept from an earlier read
    are still what storage holds (app/storage/series_generation.py)."""
    s = Series.__table__
    q = select(s.c.id, s.c.name, s.c.labels, s.c.kind, s.c.host_id, s.c.instance_id, s.c.write_gen).where(
        s.c.name.in_(list(names))
    )
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
        SeriesMeta(
            int(sid), str(name), dict(labels or {}), str(kind), int(host), None if inst is None else int(inst), int(gen)
        )
        for sid, name, labels, kind, host, inst, gen in rows
    )


def raw_points_from(engine: Engine | Connection, starts: Mapping[int, float], end: float) -> dict[int, list[Point]]:
    """Raw points of each series in `starts` over [its start, end], ascending (head and chunks
    together: app.storage.chunk_reads)."""
    hi = int(end * 1000)
    with connected(engine) as conn:
        return chunk_reads.points(conn, {sid: (int(start * 1000), hi) for sid, start in starts.items()}, seconds=True)


def raw_points_ms(engine: Engine | Connection, ranges: Mapping[int, tuple[int, int]]) -> dict[int, list[Point]]:
    """Raw points of each series in `ranges` over its [lo, hi] milliseconds (both ends in),
    ascending, timestamps in seconds: the series cache's fetches (app.derived.series_cache)."""
    if not ranges:
        return {}
    with connected(engine) as conn:
        return chunk_reads.points(conn, ranges, seconds=True)


def counter_increases(engine: Engine, ids: Sequence[int], start: float, end: float) -> dict[int, float]:
    """Reset-corrected increase of each counter over [start, end], counted from the last sample
    before start (as PromQL's increase over adjacent windows and the rollup buckets do: traffic
    between that sample and the first one inside belongs to the window). A decrease is a restart:
    the new value is all increase, as kvcore.series.increase computes it. Series with no point in
    [start, end] are absent; one point and nothing before it gives 0."""
    if not ids:
        return {}
    lo, hi = int(start * 1000), int(end * 1000)
    out: dict[int, float] = {}
    with engine.connect() as conn:
        got = chunk_reads.points(conn, dict.fromkeys((int(i) for i in ids), (lo, hi)))
        for sid, pts in got.items():
            if not pts:
                continue
            values = [v for _, v in pts]
            before = chunk_reads.points_before(conn, sid, lo)
            if before is not None:
                values.insert(0, before[1])
            out[sid] = increase_of_values(values)
    return out
