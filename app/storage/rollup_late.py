"""Late samples: raw samples that arrive after their minute was rolled up (an agent's spool
replaying hours late) are folded into the rollups again.

The ingest marks each series that got samples older than the 1-minute watermark (mark_late, in
its own transaction, so no late sample is missed); the rollup job then re-rolls those series
(reroll_late): their 1-minute buckets from the oldest late minute up to the watermark are
recomputed from raw samples (with the counter carry from the sample before), the hours that
contain them from the corrected minutes, and the series' carry is reset to its last folded
sample. Only buckets whose raw samples are still complete can be redone: samples older than the
raw retention are deleted by the same job and stay out of the rollups.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, Engine, delete, insert, select, update

from app.storage import chunk_reads
from app.storage.rollup_buckets import (
    HOUR_MS,
    MINUTE_MS,
    Bucket,
    bucket_row,
    fold_hours,
    fold_minutes,
    watermark,
)
from app.storage.rollup_models import Rollup1h, Rollup1m, RollupCarry, RollupLate

MAX_SERIES_PER_RUN = 500  # the rest waits for the next run (a transaction per series)


def mark_late(conn: Connection, rows: Sequence[tuple[int, int, float]]) -> int:
    """Called by the ingest inside its transaction with the (series_id, ts_ms, value) rows it
    stored: series with samples before the 1-minute watermark are marked (the oldest such
    sample kept). Returns how many series were marked. One indexed read when nothing is late."""
    if not rows:
        return 0
    oldest = min(r[1] for r in rows)
    wm = watermark(conn, "1m")
    if wm is None or oldest >= wm:
        return 0
    late: dict[int, int] = {}
    for sid, ts, _ in rows:
        if ts < wm and (sid not in late or ts < late[sid]):
            late[sid] = ts
    have = {
        int(s): int(f)
        for s, f in conn.execute(
            select(RollupLate.series_id, RollupLate.from_ms).where(RollupLate.series_id.in_(list(late)))
        )
    }
    for sid, ts in late.items():
        if sid not in have:
            conn.execute(insert(RollupLate).values(series_id=sid, from_ms=ts))
        elif ts < have[sid]:
            conn.execute(update(RollupLate).where(RollupLate.series_id == sid).values(from_ms=ts))
    return len(late)


def reroll_late(engine: Engine, now_ms: int, raw_retention_ms: int, counters: set[int]) -> tuple[int, int]:
    """Re-roll every marked series (up to MAX_SERIES_PER_RUN). Returns (minutes, hours) rewritten."""
    with engine.connect() as conn:
        marked = [
            (int(s), int(f))
            for s, f in conn.execute(
                select(RollupLate.series_id, RollupLate.from_ms)
                .order_by(RollupLate.series_id)
                .limit(MAX_SERIES_PER_RUN)
            )
        ]
    minutes = hours = 0
    # raw samples are complete from here on (earlier job runs cut below their own now - retention)
    complete_from = now_ms - raw_retention_ms
    complete_from += -complete_from % MINUTE_MS
    for sid, from_ms in marked:
        with engine.begin() as conn:
            # the mark may have moved since the read above: take it again inside the transaction
            row = conn.execute(select(RollupLate.from_ms).where(RollupLate.series_id == sid)).first()
            if row is None:
                continue
            from_ms = int(row[0])
            conn.execute(delete(RollupLate).where(RollupLate.series_id == sid))
            m, h = _reroll_series(conn, sid, from_ms, complete_from, sid in counters)
            minutes += m
            hours += h
    return minutes, hours


def _reroll_series(conn: Connection, sid: int, from_ms: int, complete_from: int, counter: bool) -> tuple[int, int]:
    wm_m = watermark(conn, "1m")
    if wm_m is None:
        return 0, 0
    start = max(from_ms - from_ms % MINUTE_MS, complete_from)
    if start >= wm_m:
        return 0, 0
    carry = _carry_before(conn, sid, start)
    samples = chunk_reads.points(conn, {sid: (start, wm_m - 1)})[sid]
    buckets, new_carry = fold_minutes(samples, carry, counter)
    conn.execute(
        delete(Rollup1m).where(Rollup1m.series_id == sid, Rollup1m.bucket_ms >= start, Rollup1m.bucket_ms < wm_m)
    )
    if buckets:
        conn.execute(insert(Rollup1m), [bucket_row(sid, ms, b) for ms, b in buckets])
    if samples and new_carry is not None:
        conn.execute(delete(RollupCarry).where(RollupCarry.series_id == sid))
        conn.execute(insert(RollupCarry).values(series_id=sid, ts_ms=new_carry[0], value=new_carry[1]))
    hours = 0
    wm_h = watermark(conn, "1h")
    h_start = start - start % HOUR_MS
    if wm_h is not None and h_start < wm_h:
        t = Rollup1m.__table__
        mins = [
            (int(ms), Bucket(ms / 1000.0, int(n), vmin, vmax, vsum, vlast, inc))
            for ms, n, vmin, vmax, vsum, vlast, inc in conn.execute(
                select(t.c.bucket_ms, t.c.n, t.c.vmin, t.c.vmax, t.c.vsum, t.c.vlast, t.c.inc)
                .where(t.c.series_id == sid, t.c.bucket_ms >= h_start, t.c.bucket_ms < wm_h)
                .order_by(t.c.bucket_ms)
            )
        ]
        folded = fold_hours(mins)
        conn.execute(
            delete(Rollup1h).where(Rollup1h.series_id == sid, Rollup1h.bucket_ms >= h_start, Rollup1h.bucket_ms < wm_h)
        )
        if folded:
            conn.execute(insert(Rollup1h), [bucket_row(sid, ms, b) for ms, b in folded])
        hours = len(folded)
    return len(buckets), hours


def _carry_before(conn: Connection, sid: int, start: int) -> tuple[int, float] | None:
    """The last sample before `start` (what the first bucket's increase starts from): the raw
    sample when raw still holds one within a minute of it, else the last value of the 1-minute
    bucket before, else none (the series starts there)."""
    raw = chunk_reads.points_before(conn, sid, start, since_ms=start - MINUTE_MS)
    if raw is not None:
        return raw
    prev = conn.execute(
        select(Rollup1m.vlast)
        .where(Rollup1m.series_id == sid, Rollup1m.bucket_ms < start)
        .order_by(Rollup1m.bucket_ms.desc())
        .limit(1)
    ).first()
    if prev is not None:
        return start - 1, float(prev[0])
    return None
