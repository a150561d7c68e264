"""Rollups (raw -> 1 min -> 1 h), retention, and the read of rollup buckets over a range (which
tier to read is decided above storage, in app.derived.series_reader).

The folding is pure (fold_minutes / fold_hours) so tests check it without a database; the job
(run_rollups) reads raw samples past the watermark, folds them and writes bucket rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from app.storage import chunk_reads
from app.storage.chunk_reads import first_ts
from app.storage.chunk_seal import delete_raw_before
from app.storage.models import Series
from app.storage.raw_store import connected
from app.storage.rollup_buckets import HOUR_MS, MINUTE_MS, Bucket, bucket_row, fold_hours, fold_minutes, watermark
from app.storage.rollup_models import Rollup1h, Rollup1m, RollupCarry, RollupWatermark
from app.storage.series_generation import record_kept_from
from app.storage.series_retention import delete_idle_series

GRACE_MS = 120_000  # a minute is rolled up once it is this far in the past (late pushes)
CHUNK_MS = 15 * MINUTE_MS  # raw samples read per transaction (catching up after a pause)
RETENTION_CHUNK = 500  # series per retention delete transaction


# ------------------------------------------------------------------ pure folding


# ------------------------------------------------------------------ the job
def _upsert(engine_dialect: str, table: Any) -> Any:
    if engine_dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    if engine_dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return table.insert()


def _setwatermark(conn: Connection, tier: str, done_ms: int, existed: bool) -> None:
    if existed:
        conn.execute(update(RollupWatermark).where(RollupWatermark.tier == tier).values(done_ms=done_ms))
    else:
        conn.execute(insert(RollupWatermark).values(tier=tier, done_ms=done_ms))


@dataclass
class RollupReport:
    minutes_written: int = 0
    hours_written: int = 0
    raw_deleted: int = 0
    minutes_deleted: int = 0
    hours_deleted: int = 0
    late_minutes: int = 0  # re-rolled because late samples arrived (app.storage.rollup_late)
    late_hours: int = 0
    series_deleted: int = 0  # quiet series of reporting instances (app.storage.series_retention)


def run_rollups(
    engine: Engine,
    now: float,
    *,
    raw_retention_s: float,
    m1_retention_s: float,
    h1_retention_s: float,
    max_chunks: int = 1000,
) -> RollupReport:
    """Roll raw samples up to 1 min and 1 h up to `now - grace`, then apply retention."""
    rep = RollupReport()
    dialect = engine.dialect.name
    now_ms = int(now * 1000)
    target = (now_ms - GRACE_MS) - (now_ms - GRACE_MS) % MINUTE_MS
    for _ in range(max_chunks):
        with engine.begin() as conn:
            wm = watermark(conn, "1m")
            start = wm
            if start is None:
                first = first_ts(conn)
                if first is None:
                    break
                start = first - first % MINUTE_MS
            if start >= target:
                break
            end = min(target, start + CHUNK_MS)
            rep.minutes_written += _roll_minutes(conn, dialect, start, end)
            _setwatermark(conn, "1m", end, wm is not None)
    # late samples (before the watermark when they arrived): re-roll their series' buckets
    from app.storage.rollup_late import reroll_late

    with engine.connect() as conn:
        counters = {int(sid) for (sid,) in conn.execute(select(Series.id).where(Series.kind == "counter"))}
    rep.late_minutes, rep.late_hours = reroll_late(engine, now_ms, int(raw_retention_s * 1000), counters)
    # hours: whole hours below the 1-minute watermark
    for _ in range(max_chunks):
        with engine.begin() as conn:
            m_wm = watermark(conn, "1m")
            if m_wm is None:
                break
            h_target = m_wm - m_wm % HOUR_MS
            wm = watermark(conn, "1h")
            start = wm
            if start is None:
                first_m = conn.execute(select(Rollup1m.bucket_ms).order_by(Rollup1m.bucket_ms).limit(1)).first()
                if first_m is None:
                    break
                start = int(first_m[0]) - int(first_m[0]) % HOUR_MS
            if start >= h_target:
                break
            end = min(h_target, start + 24 * HOUR_MS)
            rep.hours_written += _roll_hours(conn, dialect, start, end)
            _setwatermark(conn, "1h", end, wm is not None)
    with engine.connect() as conn:
        m_wm = watermark(conn, "1m") or 0
        ids = _all_series(conn)
    # never drop raw samples that are not rolled up yet
    raw_cut = min(now_ms - int(raw_retention_s * 1000), m_wm)
    with engine.begin() as conn:  # recorded first: readers stop serving what is about to go
        record_kept_from(conn, raw_cut)
    for chunk in id_chunks(ids, RETENTION_CHUNK):  # short write transactions: pushes go in between
        with engine.begin() as conn:
            rep.raw_deleted += delete_raw_before(conn, chunk, raw_cut)
            rep.minutes_deleted += (
                conn.execute(
                    delete(Rollup1m).where(
                        Rollup1m.series_id.in_(chunk), Rollup1m.bucket_ms < now_ms - int(m1_retention_s * 1000)
                    )
                ).rowcount
                or 0
            )
            rep.hours_deleted += (
                conn.execute(
                    delete(Rollup1h).where(
                        Rollup1h.series_id.in_(chunk), Rollup1h.bucket_ms < now_ms - int(h1_retention_s * 1000)
                    )
                ).rowcount
                or 0
            )
    rep.series_deleted = delete_idle_series(engine, ids, raw_cut)
    return rep


def _all_series(conn: Connection) -> list[int]:
    return sorted(int(sid) for (sid,) in conn.execute(select(Series.id)))


def id_chunks(ids: Sequence[int], size: int = 5000) -> Iterable[list[int]]:
    """Series ids in slices: an IN list lets the database seek each series' primary-key range
    (samples and rollups are keyed by series, then time); a slice keeps under bind limits."""
    for i in range(0, len(ids), size):
        yield list(ids[i : i + size])


def _roll_minutes(conn: Connection, dialect: str, start: int, end: int) -> int:
    kinds = {int(sid): str(kind) for sid, kind in conn.execute(select(Series.id, Series.kind))}
    carries = {
        int(sid): (int(ts), float(v))
        for sid, ts, v in conn.execute(select(RollupCarry.series_id, RollupCarry.ts_ms, RollupCarry.value))
    }
    rows: list[dict[str, Any]] = []
    new_carry: dict[int, tuple[int, float]] = {}
    for ids in id_chunks(sorted(kinds)):  # per-series primary-key range scans, never a table scan
        for sid, samples in chunk_reads.points(conn, dict.fromkeys(ids, (start, end - 1))).items():
            if not samples:
                continue
            buckets, carry = fold_minutes(samples, carries.get(sid), kinds.get(sid) == "counter")
            rows.extend(bucket_row(sid, ms, b) for ms, b in buckets)
            if carry is not None:
                new_carry[sid] = carry
    if rows:
        conn.execute(_upsert(dialect, Rollup1m.__table__), rows)
    if new_carry:
        conn.execute(delete(RollupCarry).where(RollupCarry.series_id.in_(list(new_carry))))
        conn.execute(
            insert(RollupCarry), [{"series_id": s, "ts_ms": c[0], "value": c[1]} for s, c in new_carry.items()]
        )
    return len(rows)


def _roll_hours(conn: Connection, dialect: str, start: int, end: int) -> int:
    t = Rollup1m.__table__
    rows: list[dict[str, Any]] = []
    cur_sid: int | None = None
    acc: list[tuple[int, Bucket]] = []
    found: list[Any] = []
    for ids in id_chunks(_all_series(conn)):
        found.extend(
            conn.execute(
                select(t.c.series_id, t.c.bucket_ms, t.c.n, t.c.vmin, t.c.vmax, t.c.vsum, t.c.vlast, t.c.inc)
                .where(t.c.series_id.in_(ids), t.c.bucket_ms >= start, t.c.bucket_ms < end)
                .order_by(t.c.series_id, t.c.bucket_ms)
            ).all()
        )
    for sid, ms, n, vmin, vmax, vsum, vlast, inc in found:
        if sid != cur_sid:
            if cur_sid is not None:
                rows.extend(bucket_row(cur_sid, h, b) for h, b in fold_hours(acc))
            cur_sid, acc = int(sid), []
        acc.append((int(ms), Bucket(ms / 1000, int(n), vmin, vmax, vsum, vlast, inc)))
    if cur_sid is not None:
        rows.extend(bucket_row(cur_sid, h, b) for h, b in fold_hours(acc))
    if rows:
        conn.execute(_upsert(dialect, Rollup1h.__table__), rows)
    return len(rows)


# ------------------------------------------------------------------ reading buckets
def rollup_buckets(
    engine: Engine | Connection,
    ids: Sequence[int],
    counters: set[int],
    tier: str,
    start: float,
    end: float,
    *,
    lean: bool = False,
) -> dict[int, list[Bucket]]:
    """Buckets of `tier` (1m | 1h) of each series in `ids` over [start, end], ascending by time
    (`counters`: the ids that are counters). `lean`: buckets carry only the increase (min/max/
    mean/last are 0), and only whole buckets (the one still filling at `end` is left out)."""
    with connected(engine) as conn:
        return _rollup_buckets(conn, sorted(ids), counters, tier, int(start * 1000), int(end * 1000), lean)


def _rollup_buckets(
    conn: Connection, ids: list[int], counters: set[int], tier: str, lo: int, hi: int, lean: bool = False
) -> dict[int, list[Bucket]]:
    """Buckets of `tier` over [lo, hi]: stored rollups up to the tier's watermark, and the tail
    past it (not rolled up yet: the job lags by the grace period and its interval) folded on the
    fly from the finer data, so a range ending now is complete up to the last whole bucket."""
    wm_m = watermark(conn, "1m")
    wm_h = watermark(conn, "1h")
    stored_until = (wm_m if tier == "1m" else wm_h) or lo
    stored_until = max(lo, stored_until)
    out: dict[int, list[Bucket]] = {sid: [] for sid in ids}
    t = (Rollup1m if tier == "1m" else Rollup1h).__table__
    cols = (t.c.series_id, t.c.bucket_ms, t.c.n, t.c.vmin, t.c.vmax, t.c.vsum, t.c.vlast, t.c.inc)
    if stored_until > lo:
        if conn.dialect.name == "sqlite":
            _stored_buckets_sqlite(conn, out, ids, tier, lo, stored_until, lean)
        else:
            q = select(*cols).where(t.c.series_id.in_(ids), t.c.bucket_ms >= lo, t.c.bucket_ms < stored_until)
            new = tuple.__new__  # builds the Bucket without the Python-level NamedTuple __new__ (hot path)
            if lean:
                lq = select(t.c.series_id, t.c.bucket_ms, t.c.inc).where(
                    t.c.series_id.in_(ids), t.c.bucket_ms >= lo, t.c.bucket_ms < stored_until
                )
                for sid, ms, inc in conn.execute(lq).all():
                    out[sid].append(new(Bucket, (ms / 1000.0, 0, 0.0, 0.0, 0.0, 0.0, inc)))
            else:
                for sid, ms, n, vmin, vmax, vsum, vlast, inc in conn.execute(q).all():
                    out[sid].append(new(Bucket, (ms / 1000.0, n, vmin, vmax, vsum, vlast, inc)))
            for sid in ids:
                out[sid].sort(key=itemgetter(0))
    if lean:
        # rates and quantiles use whole buckets only (a bucket ending after the range end is never
        # read by counter_rate or range_increase): skip folding the one still filling
        res_ms = MINUTE_MS if tier == "1m" else HOUR_MS
        hi = hi - hi % res_ms - 1
    if stored_until > hi:
        return out
    # tail: minutes from the 1m table (for the 1h tier) then from raw samples
    minutes: dict[int, list[tuple[int, Bucket]]] = {sid: [] for sid in ids}
    raw_from = stored_until
    if tier == "1h" and wm_m is not None and wm_m > stored_until:
        m = Rollup1m.__table__
        q = select(m.c.series_id, m.c.bucket_ms, m.c.n, m.c.vmin, m.c.vmax, m.c.vsum, m.c.vlast, m.c.inc).where(
            m.c.series_id.in_(ids), m.c.bucket_ms >= stored_until, m.c.bucket_ms < wm_m
        )
        for sid, ms, n, vmin, vmax, vsum, vlast, inc in conn.execute(q).all():
            minutes[int(sid)].append((int(ms), Bucket(ms / 1000.0, int(n), vmin, vmax, vsum, vlast, inc)))
        raw_from = wm_m
    carries: dict[int, tuple[int, float]] = {}
    if wm_m is not None and raw_from == wm_m:
        carries = {
            int(sid): (int(ts), float(v))
            for sid, ts, v in conn.execute(
                select(RollupCarry.series_id, RollupCarry.ts_ms, RollupCarry.value).where(
                    RollupCarry.series_id.in_(ids)
                )
            )
        }
    for sid, samples in chunk_reads.points(conn, dict.fromkeys(ids, (raw_from, hi))).items():
        if not samples:
            continue
        folded, _ = fold_minutes(samples, carries.get(sid), sid in counters)
        minutes[sid].extend(folded)
    for sid in ids:
        mins = sorted(minutes[sid], key=lambda mb: mb[0])
        tail = mins if tier == "1m" else fold_hours(mins)
        out[sid].extend(b for _, b in tail)
    return out


_TABLES = {"1m": Rollup1m.__tablename__, "1h": Rollup1h.__tablename__}


def _stored_buckets_sqlite(
    conn: Connection, out: dict[int, list[Bucket]], ids: list[int], tier: str, lo: int, hi: int, lean: bool
) -> None:
    """The hot read of a 30-day chart (tens of thousands of buckets), on SQLite: one primary-key
    range scan per series through the driver's cursor, ascending by bucket_ms; ts in seconds
    computed by SQLite (the same IEEE division as ms / 1000.0); rows made Buckets by C code (map
    over tuple.__new__, zip with constant zeros for the lean columns), no Python per row. Lean
    reads fetch two columns: every column fetched costs about as much as the row scan."""
    table = _TABLES[tier]
    make = partial(tuple.__new__, Bucket)
    cur = conn.connection.cursor()
    try:
        if lean:
            sql = (
                f"SELECT bucket_ms / 1000.0, inc FROM {table} "
                "WHERE series_id = ? AND bucket_ms >= ? AND bucket_ms < ? ORDER BY bucket_ms"
            )
            zi, zf = repeat(0), repeat(0.0)
            for sid in ids:
                rows = cur.execute(sql, (sid, lo, hi)).fetchall()
                if rows:
                    ts, inc = zip(*rows, strict=True)
                    out[sid] = list(map(make, zip(ts, zi, zf, zf, zf, zf, inc, strict=False)))  # repeat() is endless
        else:
            sql = (
                f"SELECT bucket_ms / 1000.0, n, vmin, vmax, vsum, vlast, inc FROM {table} "
                "WHERE series_id = ? AND bucket_ms >= ? AND bucket_ms < ? ORDER BY bucket_ms"
            )
            for sid in ids:
                out[sid] = list(map(make, cur.execute(sql, (sid, lo, hi))))
    finally:
        cur.close()


def scrape_gap(engine: Engine, instance_id: int, start: float, end: float, limit: int = 400) -> float | None:
    """Median time between scrapes of an instance in [start, end] (seconds), from the timestamps of
    one of its series (every sample of a scrape shares its timestamp). None with < 2 samples."""
    lo, hi = int(start * 1000), int(end * 1000)
    with engine.connect() as conn:
        for (sid,) in conn.execute(select(Series.id).where(Series.instance_id == instance_id).order_by(Series.id)):
            ts = chunk_reads.tail_ts(conn, int(sid), lo, hi, limit)[::-1]
            if len(ts) >= 2:
                gaps = sorted(ts[i] - ts[i + 1] for i in range(len(ts) - 1))
                return gaps[len(gaps) // 2] / 1000.0
            if ts:
                return None
    return None
