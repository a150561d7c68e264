"""The sealing job: raw samples older than HEAD_KEEP_MS move from the head (`samples`, one row
per sample, what the ingest writes) into per-series chunks (app/storage/chunk_codec.py), like
Prometheus's head block being cut into chunks.

Per series: the head's samples below the cut are appended to the series' open chunk
(`open_chunks`, re-encoded each run); once it holds CHUNK_SAMPLES samples or CHUNK_BYTES bytes
it goes to `sample_chunks` (written once; on SQLite a rowid table, so sealed chunks fill pages in
the order written). Late samples (older than what a series' chunks already hold: a spool
replayed after an outage) are merged into the chunks they fall in: those chunks are decoded,
merged and written again. A timestamp already in a chunk keeps the chunk's value (the head's
INSERT ... ON CONFLICT DO NOTHING keeps the first stored, too).

Each batch of SERIES_PER_TX series is one transaction: the head rows are taken with DELETE ...
RETURNING and the chunks written in the same transaction, so a kill -9 at any point loses or
duplicates nothing, a push landing meanwhile is either in the batch or left in the head, and the
next run goes on where the last stopped. The same job converts a database upgraded to
0013_sample_chunks (all its raw rows start in the head), in the background while the app serves.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, delete, func, insert, select, text

from app.storage import chunk_codec
from app.storage.models import OpenChunk, SampleChunk, SampleRow

HEAD_KEEP_MS = 60_000  # the head keeps the last minute as rows (a push's samples, unencoded)
CHUNK_SAMPLES = 1920  # samples per sealed chunk at most (32 min at 1 s, 5 h at 10 s)
# bytes per sealed chunk at most: four fit in a 4 KiB SQLite page with their row headers
CHUNK_BYTES = 960
SERIES_PER_TX = 200
ROWS_PER_TX = 20_000  # head rows per sealing transaction at most (but one series at least)
SLICE_MS = 900_000  # a long head is sealed a quarter of an hour at a time (see seal_head)
_PG_LOCK = 0x6B7673_28  # pg_advisory_xact_lock key: one sealer at a time across app processes

MsPoint = tuple[int, float]


@dataclass
class SealReport:
    series: int = 0  # series with samples sealed
    samples: int = 0  # head rows moved into chunks
    chunks_sealed: int = 0  # chunks written to sample_chunks
    late: int = 0  # series whose late samples were merged into chunks already sealed
    head_left: int = 0  # head rows below the cut still there when max_batches ran out


def seal_head(
    engine: Engine, now: float, *, keep_ms: int = HEAD_KEEP_MS, max_batches: int = 10_000, batch: int = SERIES_PER_TX
) -> SealReport:
    """Move the head's samples older than `now - keep_ms` into chunks, SERIES_PER_TX series per
    transaction; stops after `max_batches` transactions (the next run goes on). A long head (a
    database upgraded from 0012, or after a pause) is sealed SLICE_MS at a time, all series per
    slice, so sealed chunks are written in about time order and the oldest fill whole pages: the
    retention and the budget then free pages, not holes in them."""
    rep = SealReport()
    cut = int(now * 1000) - keep_ms
    with engine.connect() as conn:
        oldest = conn.execute(select(func.min(SampleRow.ts_ms))).scalar()
    if oldest is None or int(oldest) >= cut:
        return rep
    done = 0
    slice_cut = min(cut, int(oldest) + SLICE_MS)
    while True:
        with engine.connect() as conn:
            rows = {
                int(sid): int(n)
                for sid, n in conn.execute(
                    select(SampleRow.series_id, func.count())
                    .where(SampleRow.ts_ms < slice_cut)
                    .group_by(SampleRow.series_id)
                    .order_by(SampleRow.series_id)
                )
            }
        for ids in _transactions(rows, batch):
            if done >= max_batches:
                with engine.connect() as conn:
                    rep.head_left = int(
                        conn.execute(
                            select(func.count()).select_from(SampleRow).where(SampleRow.ts_ms < cut)
                        ).scalar_one()
                    )
                return rep
            with engine.begin() as conn:
                _seal_batch(conn, ids, slice_cut, rep)
            done += 1
        if slice_cut >= cut:
            return rep
        slice_cut = min(cut, slice_cut + SLICE_MS)


def _transactions(rows: dict[int, int], batch: int) -> list[list[int]]:
    """Series ids in groups of at most `batch` series and about ROWS_PER_TX head rows: a write
    transaction short enough that pushes (waiting for SQLite's one writer) hardly notice it."""
    out: list[list[int]] = []
    cur: list[int] = []
    n = 0
    for sid, count in rows.items():
        if cur and (len(cur) >= batch or n + count > ROWS_PER_TX):
            out.append(cur)
            cur, n = [], 0
        cur.append(sid)
        n += count
    if cur:
        out.append(cur)
    return out


def _take_head(conn: Connection, ids: list[int], cut: int) -> dict[int, list[MsPoint]]:
    """Delete and return the head rows of `ids` below `cut`, ascending per series."""
    rows = conn.execute(
        delete(SampleRow)
        .where(SampleRow.series_id.in_(ids), SampleRow.ts_ms < cut)
        .returning(SampleRow.series_id, SampleRow.ts_ms, SampleRow.value)
    ).all()
    out: dict[int, list[MsPoint]] = {}
    for sid, ts, v in rows:
        out.setdefault(int(sid), []).append((int(ts), float(v)))
    for pts in out.values():
        pts.sort()
    return out


def _seal_batch(conn: Connection, ids: list[int], cut: int, rep: SealReport) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK})
    head = _take_head(conn, ids, cut)
    if not head:
        return
    got = list(head)
    opens = {
        int(sid): (int(start), int(end), bytes(data))
        for sid, start, end, data in conn.execute(
            select(OpenChunk.series_id, OpenChunk.start_ms, OpenChunk.end_ms, OpenChunk.data).where(
                OpenChunk.series_id.in_(got)
            )
        )
    }
    sealed_end = {
        int(sid): int(end)
        for sid, end in conn.execute(
            select(SampleChunk.series_id, func.max(SampleChunk.end_ms))
            .where(SampleChunk.series_id.in_(got))
            .group_by(SampleChunk.series_id)
        )
    }
    new_sealed: list[dict[str, object]] = []
    new_open: list[dict[str, object]] = []
    for sid in got:
        pts = head[sid]
        rep.series += 1
        rep.samples += len(pts)
        last_sealed = sealed_end.get(sid)
        sealed_part: list[MsPoint] = []
        if last_sealed is not None and pts[0][0] <= last_sealed:
            # late samples among sealed chunks: those from the first one they touch on are rewritten
            rep.late += 1
            sealed_part = _take_sealed_from(conn, sid, pts[0][0])
            k = bisect_right(pts, (last_sealed, float("inf")))
            sealed_part = _merged(sealed_part, pts[:k])
            pts = pts[k:]
        open_pts: list[MsPoint] = []
        if sid in opens:
            ts, values = chunk_codec.decode(opens[sid][2])
            open_pts = list(zip(ts, values, strict=True))
        open_pts = _merged(open_pts, pts)
        new_sealed.extend(_row(sid, chunk) for chunk in _split(sealed_part))
        full, rest = _fill(open_pts)
        new_sealed.extend(_row(sid, chunk) for chunk in full)
        if rest:
            new_open.append(_row(sid, rest))
    if opens:
        conn.execute(delete(OpenChunk).where(OpenChunk.series_id.in_(list(opens))))
    if new_sealed:
        conn.execute(insert(SampleChunk), new_sealed)
        rep.chunks_sealed += len(new_sealed)
    if new_open:
        conn.execute(insert(OpenChunk), new_open)


def _take_sealed_from(conn: Connection, sid: int, from_ms: int) -> list[MsPoint]:
    """Delete and decode the sealed chunks of `sid` that end at or after `from_ms`."""
    rows = conn.execute(
        delete(SampleChunk)
        .where(SampleChunk.series_id == sid, SampleChunk.end_ms >= from_ms)
        .returning(SampleChunk.start_ms, SampleChunk.data)
    ).all()
    out: list[MsPoint] = []
    for _, data in sorted(rows, key=lambda r: int(r[0])):
        ts, values = chunk_codec.decode(bytes(data))
        out.extend(zip(ts, values, strict=True))
    return out


def _merged(kept: list[MsPoint], new: list[MsPoint]) -> list[MsPoint]:
    """Ascending union; on equal timestamps the point of `kept` (stored first) stays."""
    if not kept:
        return new
    if not new:
        return kept
    if kept[-1][0] < new[0][0]:
        return kept + new
    d = dict(new)
    d.update(kept)
    return sorted(d.items())


def _fits(pts: Sequence[MsPoint]) -> tuple[int, int]:
    """How many of `pts` (from the first) one sealed chunk takes, and its size: CHUNK_SAMPLES at
    most, and no more than fit in CHUNK_BYTES (a few trial encodings, each in C)."""
    k = min(len(pts), CHUNK_SAMPLES)
    while True:
        size = len(_encode(pts[:k]))
        if size <= CHUNK_BYTES or k == 1:
            return k, size
        k = max(1, min(k - 1, int(k * CHUNK_BYTES / size * 0.97)))


def _fill(pts: list[MsPoint]) -> tuple[list[list[MsPoint]], list[MsPoint]]:
    """Cut full chunks off the front of an open chunk's points; the rest stays open."""
    full: list[list[MsPoint]] = []
    while pts:
        k, size = _fits(pts)
        if k == len(pts) and k < CHUNK_SAMPLES and size < CHUNK_BYTES:
            break  # not full yet: stays open
        full.append(pts[:k])
        pts = pts[k:]
    return full, pts


def _split(pts: list[MsPoint]) -> list[list[MsPoint]]:
    """Points of chunks being rewritten (late samples merged in) as sealed chunks again."""
    out: list[list[MsPoint]] = []
    while pts:
        k, _ = _fits(pts)
        out.append(pts[:k])
        pts = pts[k:]
    return out


def _encode(pts: Sequence[MsPoint]) -> bytes:
    return chunk_codec.encode([p[0] for p in pts], [p[1] for p in pts])


def _row(sid: int, pts: Sequence[MsPoint]) -> dict[str, object]:
    return {"series_id": sid, "start_ms": pts[0][0], "end_ms": pts[-1][0], "n": len(pts), "data": _encode(pts)}


def delete_raw_before(conn: Connection, ids: Sequence[int], cut_ms: int) -> int:
    """Raw retention: head rows before `cut_ms`, and chunks whose every sample is before it (a
    chunk holding samples on both sides stays whole until its last one is past the cut)."""
    head = delete(SampleRow).where(SampleRow.series_id.in_(list(ids)), SampleRow.ts_ms < cut_ms)
    n = conn.execute(head).rowcount or 0
    n += (
        conn.execute(
            select(func.coalesce(func.sum(SampleChunk.n), 0)).where(
                SampleChunk.series_id.in_(list(ids)), SampleChunk.end_ms < cut_ms
            )
        ).scalar_one()
        or 0
    )
    conn.execute(delete(SampleChunk).where(SampleChunk.series_id.in_(list(ids)), SampleChunk.end_ms < cut_ms))
    opened = conn.execute(
        select(func.coalesce(func.sum(OpenChunk.n), 0)).where(
            OpenChunk.series_id.in_(list(ids)), OpenChunk.end_ms < cut_ms
        )
    ).scalar_one()
    n += int(opened or 0)
    conn.execute(delete(OpenChunk).where(OpenChunk.series_id.in_(list(ids)), OpenChunk.end_ms < cut_ms))
    return int(n)


def delete_series_raw(conn: Connection, ids: Sequence[int]) -> None:
    """Every raw sample of `ids` (the series themselves are being deleted)."""
    for table in (SampleRow, OpenChunk, SampleChunk):
        conn.execute(delete(table).where(table.series_id.in_(list(ids))))
