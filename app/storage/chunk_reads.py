"""Reads of raw samples across the three places they live: the head (`samples`, what the ingest
writes), the series' open chunk and its sealed chunks (app/storage/chunk_seal.py moves samples
head -> open -> sealed).

Every read of raw points goes through here (raw_store, rollups, late re-rolls, retention, the
ingest's last values). The places are read in the order samples move through them (head, then
open, then sealed): a sample the sealing job moves while a read runs is then seen twice, never
missed, and the parts are merged with duplicates dropped (a chunk's value wins: it was stored
first, as the head's INSERT ... ON CONFLICT DO NOTHING keeps the first). Parts that do not
overlap (the usual case) are just concatenated.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, func, select, union_all

from app.storage import chunk_codec
from app.storage.models import OpenChunk, SampleChunk, SampleRow

MsPoint = tuple[int, float]  # (ts ms, value)
Point = tuple[float, float]  # (ts seconds, value)
IN_CHUNK = 500  # series per IN (...) list


def _merge(a: list[Any], b: list[Any]) -> list[Any]:
    """Two ascending point lists as one; on equal timestamps `a`'s point is kept."""
    if not a:
        return b
    if not b:
        return a
    if a[-1][0] < b[0][0]:
        return a + b
    merged = dict(b)
    merged.update(a)
    return sorted(merged.items())


def _decoded(blob: bytes, seconds: bool) -> list[Any]:
    if seconds:
        return chunk_codec.decode_points(blob)
    ts, values = chunk_codec.decode(blob)
    return list(zip(ts, values, strict=True))


_T = itemgetter(0)


def _chunk_points(chunks: Sequence[tuple[int, int, bytes]], lo: int, hi: int, seconds: bool) -> list[Any]:
    """The points within [lo, hi] ms of a series' chunks, given as (start_ms, end_ms, data). Chunks
    of one series do not overlap (the sealing job rewrites what a late sample touches), so they
    are decoded in start order and joined; only the first and last can reach past [lo, hi], and
    only those are cut. Should two overlap all the same, they are merged (the first one's point
    kept on equal timestamps)."""
    ordered = sorted(chunks, key=_T) if len(chunks) > 1 else chunks
    out: list[Any] = []
    last_end: int | None = None
    for start, end, blob in ordered:
        pts = _decoded(blob, seconds)
        if start < lo or end > hi:
            lo_t, hi_t = (lo / 1000.0, hi / 1000.0) if seconds else (lo, hi)
            pts = pts[bisect_left(pts, lo_t, key=_T) : bisect_right(pts, hi_t, key=_T)]
        if not pts:
            continue
        if last_end is None or last_end < start:
            out.extend(pts)
        else:
            out = _merge(out, pts)
        last_end = end if last_end is None else max(last_end, end)
    return out


def points(conn: Connection, ranges: Mapping[int, tuple[int, int]], *, seconds: bool = False) -> dict[int, list[Any]]:
    """Raw points of each series over its [lo, hi] ms (both ends in), ascending: (ts ms, value),
    or with `seconds` (ts / 1000.0, value). Series without points come back empty.

    Per group of series with one range: the head rows (per series on SQLite, a primary-key range
    scan whose rows the driver builds as tuples in C; one query for the group elsewhere), then one
    query for the chunks (open and sealed together, one statement: one snapshot) of every series
    of the group. The head is read first: a sample the sealing job moves from the head into a
    chunk between the two reads is then seen twice (and dropped once), never missed."""
    out: dict[int, list[Any]] = {sid: [] for sid in ranges}
    if not ranges:
        return out
    by_range: dict[tuple[int, int], list[int]] = {}
    for sid, rng in ranges.items():
        by_range.setdefault(rng, []).append(sid)
    sqlite = conn.dialect.name == "sqlite"
    for (lo, hi), all_ids in by_range.items():
        for i in range(0, len(all_ids), IN_CHUNK):
            ids = all_ids[i : i + IN_CHUNK]
            head = _head_sqlite(conn, ids, lo, hi, seconds) if sqlite else _head(conn, ids, lo, hi, seconds)
            chunks = _chunks_of(conn, ids, lo, hi)
            for sid in ids:
                got = chunks.get(sid)
                rows = head.get(sid, [])
                out[sid] = _merge(_chunk_points(got, lo, hi, seconds), rows) if got else rows
    return out


def _chunks_of(conn: Connection, ids: list[int], lo: int, hi: int) -> dict[int, list[tuple[int, int, bytes]]]:
    """(start_ms, end_ms, data) of the open and sealed chunks of `ids` that reach into [lo, hi]."""
    if conn.dialect.name == "sqlite":  # the driver's cursor: no statement to build per IN list
        marks = ",".join("?" * len(ids))
        sql = (
            f"SELECT series_id, start_ms, end_ms, data FROM sample_chunks WHERE series_id IN ({marks}) "
            f"AND end_ms >= ? AND start_ms <= ? UNION ALL SELECT series_id, start_ms, end_ms, data "
            f"FROM open_chunks WHERE series_id IN ({marks}) AND end_ms >= ? AND start_ms <= ?"
        )
        cur = conn.connection.cursor()
        try:
            rows = cur.execute(sql, (*ids, lo, hi, *ids, lo, hi)).fetchall()
        finally:
            cur.close()
    else:
        rows = list(conn.execute(_chunks_query(ids, lo, hi)))
    out: dict[int, list[tuple[int, int, bytes]]] = {}
    for sid, start, end, data in rows:
        out.setdefault(int(sid), []).append((int(start), int(end), bytes(data)))
    return out


def _chunks_query(ids: list[int], lo: int, hi: int) -> Any:
    o, c = OpenChunk.__table__.c, SampleChunk.__table__.c
    return union_all(
        select(c.series_id, c.start_ms, c.end_ms, c.data).where(c.series_id.in_(ids), c.end_ms >= lo, c.start_ms <= hi),
        select(o.series_id, o.start_ms, o.end_ms, o.data).where(o.series_id.in_(ids), o.end_ms >= lo, o.start_ms <= hi),
    )


def _head(conn: Connection, ids: list[int], lo: int, hi: int, seconds: bool) -> dict[int, list[Any]]:
    h = SampleRow.__table__.c
    head: dict[int, list[Any]] = {}
    for sid, ts, v in conn.execute(
        select(h.series_id, h.ts_ms, h.value)
        .where(h.series_id.in_(ids), h.ts_ms >= lo, h.ts_ms <= hi)
        .order_by(h.series_id, h.ts_ms)
    ):
        head.setdefault(int(sid), []).append((ts / 1000.0 if seconds else int(ts), float(v)))
    return head


_HEAD_S = "SELECT ts_ms / 1000.0, value FROM samples WHERE series_id = ? AND ts_ms >= ? AND ts_ms <= ? ORDER BY ts_ms"
_HEAD_MS = "SELECT ts_ms, value FROM samples WHERE series_id = ? AND ts_ms >= ? AND ts_ms <= ? ORDER BY ts_ms"


def _head_sqlite(conn: Connection, ids: list[int], lo: int, hi: int, seconds: bool) -> dict[int, list[Any]]:
    """The hot read on SQLite: a primary-key range scan per series through the driver's cursor."""
    cur = conn.connection.cursor()
    sql = _HEAD_S if seconds else _HEAD_MS
    try:
        return {sid: cur.execute(sql, (sid, lo, hi)).fetchall() for sid in ids}
    finally:
        cur.close()


_TAIL_HEAD = "SELECT ts_ms FROM samples WHERE series_id = ? AND ts_ms >= ? AND ts_ms <= ? ORDER BY ts_ms DESC LIMIT ?"
_TAIL_CHUNKS = (
    "SELECT start_ms, end_ms, n, data FROM sample_chunks WHERE series_id = ? AND end_ms >= ? AND start_ms <= ? "
    "UNION ALL SELECT start_ms, end_ms, n, data FROM open_chunks WHERE series_id = ? AND end_ms >= ? "
    "AND start_ms <= ? ORDER BY end_ms DESC"
)


@contextmanager
def _tail_rows(conn: Connection, sid: int, lo: int, hi: int, limit: int) -> Iterator[tuple[list[Any], Iterable[Any]]]:
    """The head's newest timestamps (descending) and the chunks' (start, end, n, data), newest
    first, read lazily: on SQLite through the driver's cursor (the charts' scrape-gap read, once
    per chart; the statement objects cost more than the read)."""
    if conn.dialect.name == "sqlite":
        cur = conn.connection.cursor()
        try:
            head = cur.execute(_TAIL_HEAD, (sid, lo, hi, limit)).fetchall()
            yield head, cur.execute(_TAIL_CHUNKS, (sid, lo, hi, sid, lo, hi))
        finally:
            cur.close()
        return
    h, o, c = SampleRow.__table__.c, OpenChunk.__table__.c, SampleChunk.__table__.c
    head = list(
        conn.execute(
            select(h.ts_ms)
            .where(h.series_id == sid, h.ts_ms >= lo, h.ts_ms <= hi)
            .order_by(h.ts_ms.desc())
            .limit(limit)
        )
    )
    chunks = union_all(
        select(c.start_ms, c.end_ms, c.n, c.data).where(c.series_id == sid, c.end_ms >= lo, c.start_ms <= hi),
        select(o.start_ms, o.end_ms, o.n, o.data).where(o.series_id == sid, o.end_ms >= lo, o.start_ms <= hi),
    ).subquery()
    result = conn.execute(select(chunks).order_by(chunks.c.end_ms.desc()))
    try:
        yield head, result
    finally:
        result.close()


def tail_ts(conn: Connection, sid: int, lo: int, hi: int, limit: int) -> list[int]:
    """The timestamps (ms) of the last `limit` raw points of a series in [lo, hi], ascending: the
    head's newest rows, then chunks from the newest back until there are enough (a long range
    decodes only its end). The head is read first, as in `points`."""
    got: list[tuple[int, int, bytes]] = []
    with _tail_rows(conn, sid, lo, hi, limit) as (head_rows, chunk_rows):
        head = [int(t) for (t,) in reversed(head_rows)]
        held = len(head)
        for start, end, n, data in chunk_rows:
            got.append((int(start), int(end), bytes(data)))
            held += int(n)
            if held >= 2 * limit:  # twice: a chunk and the head may hold the same samples
                break
    ts = [t for t, _ in _merge(_chunk_points(got, lo, hi, False), [(t, 0.0) for t in head])] if got else head
    return ts[-limit:]


def points_before(conn: Connection, sid: int, before_ms: int, since_ms: int | None = None) -> MsPoint | None:
    """The last raw point of a series before `before_ms` (and at or after `since_ms`), or None."""
    lo = since_ms if since_ms is not None else -(2**62)
    h, o, c = SampleRow.__table__.c, OpenChunk.__table__.c, SampleChunk.__table__.c
    best: MsPoint | None = None
    row = conn.execute(
        select(h.ts_ms, h.value)
        .where(h.series_id == sid, h.ts_ms < before_ms, h.ts_ms >= lo)
        .order_by(h.ts_ms.desc())
        .limit(1)
    ).first()
    if row is not None:
        best = (int(row[0]), float(row[1]))
    blobs = [
        bytes(d)
        for (d,) in conn.execute(select(o.data).where(o.series_id == sid, o.start_ms < before_ms, o.end_ms >= lo))
    ]
    if not blobs:  # the sealed chunk holding the last point before: the first ending at or after it, or the last
        got = conn.execute(
            select(c.data)
            .where(c.series_id == sid, c.end_ms >= lo, c.start_ms < before_ms)
            .order_by(c.end_ms.desc())
            .limit(1)
        ).first()
        if got is not None:
            blobs = [bytes(got[0])]
    for blob in blobs:
        ts, values = chunk_codec.decode(blob)
        i = bisect_left(ts, before_ms) - 1
        if i >= 0 and ts[i] >= lo and (best is None or ts[i] >= best[0]):
            best = (ts[i], values[i])
    return best


def last_points(conn: Connection, series_ids: Sequence[int]) -> dict[int, MsPoint]:
    """The newest stored point of each series (head, else its open chunk, else its last sealed
    chunk), whichever is newest."""
    out: dict[int, MsPoint] = {}
    h, o, c = SampleRow.__table__.c, OpenChunk.__table__.c, SampleChunk.__table__.c
    for i in range(0, len(series_ids), IN_CHUNK):
        ids = list(series_ids[i : i + IN_CHUNK])
        newest = select(h.series_id, func.max(h.ts_ms).label("ts")).where(h.series_id.in_(ids)).group_by(h.series_id)
        sub = newest.subquery()
        for sid, ts, v in conn.execute(
            select(h.series_id, h.ts_ms, h.value).join(sub, (sub.c.series_id == h.series_id) & (sub.c.ts == h.ts_ms))
        ):
            out[int(sid)] = (int(ts), float(v))
        last_sealed = (
            select(c.series_id, func.max(c.end_ms).label("end_ms")).where(c.series_id.in_(ids)).group_by(c.series_id)
        ).subquery()
        chunk_rows = union_all(
            select(o.series_id, o.end_ms, o.data).where(o.series_id.in_(ids)),
            select(c.series_id, c.end_ms, c.data).join(
                last_sealed, (last_sealed.c.series_id == c.series_id) & (last_sealed.c.end_ms == c.end_ms)
            ),
        )
        best: dict[int, tuple[int, bytes]] = {}
        for sid, end, data in conn.execute(chunk_rows):
            if int(sid) not in best or int(end) > best[int(sid)][0]:
                best[int(sid)] = (int(end), bytes(data))
        for sid, (end, data) in best.items():
            if sid in out and out[sid][0] >= end:
                continue
            ts, values = chunk_codec.decode(data)
            out[sid] = (ts[-1], values[-1])
    return out


def series_with_points_after(conn: Connection, series_ids: Sequence[int], after_ms: int) -> set[int]:
    """The series of `series_ids` holding a raw point after `after_ms` (head or chunks): index
    seeks only, nothing decoded."""
    h, o, c = SampleRow.__table__.c, OpenChunk.__table__.c, SampleChunk.__table__.c
    out: set[int] = set()
    for i in range(0, len(series_ids), IN_CHUNK):
        ids = list(series_ids[i : i + IN_CHUNK])
        if conn.dialect.name == "sqlite":  # the driver's cursor: a fifth of the statement's cost here
            marks = ",".join("?" * len(ids))
            sql = (
                f"SELECT DISTINCT series_id FROM samples WHERE series_id IN ({marks}) AND ts_ms > ? "
                f"UNION ALL SELECT series_id FROM open_chunks WHERE series_id IN ({marks}) AND end_ms > ? "
                f"UNION ALL SELECT DISTINCT series_id FROM sample_chunks WHERE series_id IN ({marks}) AND end_ms > ?"
            )
            cur = conn.connection.cursor()
            try:
                out.update(int(r[0]) for r in cur.execute(sql, (*ids, after_ms, *ids, after_ms, *ids, after_ms)))
            finally:
                cur.close()
            continue
        q = union_all(
            select(h.series_id).where(h.series_id.in_(ids), h.ts_ms > after_ms).distinct(),
            select(o.series_id).where(o.series_id.in_(ids), o.end_ms > after_ms),
            select(c.series_id).where(c.series_id.in_(ids), c.end_ms > after_ms).distinct(),
        )
        out.update(int(sid) for (sid,) in conn.execute(q))
    return out


def has_points(conn: Connection) -> Any:
    """A correlated EXISTS for a query over `series`: the series has a raw sample anywhere."""
    from app.storage.models import Series

    sid = Series.__table__.c.id
    return (
        select(SampleRow.series_id).where(SampleRow.series_id == sid).exists()
        | select(OpenChunk.series_id).where(OpenChunk.series_id == sid).exists()
        | select(SampleChunk.series_id).where(SampleChunk.series_id == sid).exists()
    )


def first_ts(conn: Connection) -> int | None:
    """The oldest raw timestamp held (head or chunks), or None when there is none."""
    found = [
        conn.execute(select(func.min(SampleRow.ts_ms))).scalar(),
        conn.execute(select(func.min(OpenChunk.start_ms))).scalar(),
        conn.execute(select(func.min(SampleChunk.start_ms))).scalar(),
    ]
    have = [int(x) for x in found if x is not None]
    return min(have) if have else None


def count(conn: Connection) -> int:
    """Raw samples held: head rows plus the samples of every chunk (a sample pushed again after
    it was sealed counts twice until the next sealing merges it)."""
    head = int(conn.execute(select(func.count()).select_from(SampleRow)).scalar_one())
    opened = int(conn.execute(select(func.coalesce(func.sum(OpenChunk.n), 0))).scalar_one())
    sealed = int(conn.execute(select(func.coalesce(func.sum(SampleChunk.n), 0))).scalar_one())
    return head + opened + sealed
