"""Late samples (a spool replaying after its minutes were rolled up): the ingest marks the series,
the rollup job re-rolls the affected 1-minute and 1-hour buckets, and both tiers then equal a
fold of the raw samples."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from app.storage.models import SampleRow, Series
from app.storage.rollup_buckets import Bucket, fold_hours, fold_minutes
from app.storage.rollup_models import Rollup1h, Rollup1m, RollupLate
from tests.app.dashboard.recorded import push_all, recorded_batches
from tests.fed_databases import Feed


def _truth(engine: Any) -> tuple[dict[tuple[int, int], Bucket], dict[tuple[int, int], Bucket]]:
    """Every series' raw samples folded from scratch, up to the job's watermarks."""
    from app.storage.rollup_buckets import watermark as _watermark

    m_out: dict[tuple[int, int], Bucket] = {}
    h_out: dict[tuple[int, int], Bucket] = {}
    with engine.connect() as conn:
        wm_m, wm_h = _watermark(conn, "1m"), _watermark(conn, "1h")
        assert wm_m is not None and wm_h is not None
        for sid, kind in conn.execute(select(Series.id, Series.kind)).all():
            raw = [
                (int(t), float(v))
                for t, v in conn.execute(
                    select(SampleRow.ts_ms, SampleRow.value)
                    .where(SampleRow.series_id == sid, SampleRow.ts_ms < wm_m)
                    .order_by(SampleRow.ts_ms)
                )
            ]
            minutes, _ = fold_minutes(raw, None, kind == "counter")
            m_out.update({(sid, ms): b for ms, b in minutes})
            h_out.update({(sid, ms): b for ms, b in fold_hours([mb for mb in minutes if mb[0] < wm_h])})
    return m_out, h_out


def _stored(engine: Any, table: Any) -> dict[tuple[int, int], Bucket]:
    t = table.__table__
    with engine.connect() as conn:
        return {
            (int(r[0]), int(r[1])): Bucket(r[1] / 1000.0, *r[2:])
            for r in conn.execute(
                select(t.c.series_id, t.c.bucket_ms, t.c.n, t.c.vmin, t.c.vmax, t.c.vsum, t.c.vlast, t.c.inc)
            )
        }


def _same(a: dict[tuple[int, int], Bucket], b: dict[tuple[int, int], Bucket]) -> bool:
    if a.keys() != b.keys():
        return False
    for k, x in a.items():
        y = b[k]
        if x.n != y.n or (x.inc is None) != (y.inc is None):
            return False
        for f in ("vmin", "vmax", "vsum", "vlast", "inc"):
            u, v = getattr(x, f), getattr(y, f)
            if u is not None and not _close(v, u):
                return False
    return True


def _close(v: float | None, u: float) -> bool:
    """pytest.approx(u, rel=1e-12, abs=1e-9) == v, without building an approx per value (the
    comparison runs ~100,000 times per test)."""
    return v is not None and (v == u or abs(v - u) <= max(1e-12 * abs(u), 1e-9))


T0 = 1_800_000_000.0  # the clock fixture's start


def _replayed() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(all, on time, late) batches of an agent that lost its link for ~40 min (across an hour
    boundary, and across the restart) and every 7th scrape of the first hour: those arrive later,
    replayed from its spool."""
    batches = recorded_batches(T0 - 3 * 3600, 700, interval=15.0, reset_at=300)
    late = [b for i, b in enumerate(batches) if 260 <= i < 420 or (i < 240 and i % 7 == 3)]
    late_seqs = {b["seq"] for b in late}
    return batches, [b for b in batches if b["seq"] not in late_seqs], late


def _with_a_hole() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(all, on time, late) batches where 20 scrapes ~2.6 h old when replayed arrive late."""
    batches = recorded_batches(T0 - 3 * 3600, 500, interval=20.0)
    late = [b for i, b in enumerate(batches) if 30 <= i < 50]
    return batches, [b for i, b in enumerate(batches) if not 30 <= i < 50], late


# the on-time batches through the ingest API, fed once per session and copied per test
REPLAYED_ON_TIME = Feed("late-replayed", lambda: _replayed()[1])
HOLE_ON_TIME = Feed("late-hole", lambda: _with_a_hole()[1])


@pytest.mark.slow  # re-rolls hours of recorded scrapes
@pytest.mark.fed_database(REPLAYED_ON_TIME)
def test_late_replayed_samples_are_rolled_into_both_tiers(app: Any, client: Any, token: str, clock: Any) -> None:
    from app.web.jobs import run_job_now

    ctx = app.state.ctx
    engine = ctx.engine
    batches, on_time, late = _replayed()
    clock.t = on_time[-1]["sent_at"] + 0.2  # where pushing the on-time batches left the app's clock
    last = batches[-1]["sent_at"]
    run_job_now(ctx, "rollups", now=last + 300)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(RollupLate)).scalar_one() == 0  # nothing late yet
    minutes_before = _stored(engine, Rollup1m)

    push_all(client, token, late)  # hours late: every minute they fall in was rolled up already
    with engine.connect() as conn:
        marked = conn.execute(select(func.count()).select_from(RollupLate)).scalar_one()
        nseries = conn.execute(select(func.count()).select_from(Series)).scalar_one()
    assert marked == nseries  # every series of those scrapes got samples below the watermark
    truth_m, truth_h = _truth(engine)
    assert not _same(minutes_before, truth_m)  # without the re-roll the rollups miss them

    run_job_now(ctx, "rollups", now=last + 360)
    assert _same(_stored(engine, Rollup1m), truth_m)
    assert _same(_stored(engine, Rollup1h), truth_h)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(RollupLate)).scalar_one() == 0
    # the next job runs carry on from the corrected carry: still equal to the raw fold
    push_all(client, token, recorded_batches(last, 40, interval=15.0, seq0=5000, seed=7), clock)
    run_job_now(ctx, "rollups", now=clock() + 600)
    truth_m, truth_h = _truth(engine)
    assert _same(_stored(engine, Rollup1m), truth_m)
    assert _same(_stored(engine, Rollup1h), truth_h)


@pytest.mark.slow  # re-rolls hours of recorded scrapes
@pytest.mark.fed_database(HOLE_ON_TIME)
def test_late_samples_older_than_raw_retention_are_dropped_cleanly(
    app: Any, client: Any, token: str, clock: Any
) -> None:
    from app.web.jobs import run_job_now

    ctx = app.state.ctx
    engine = ctx.engine
    batches, on_time, late = _with_a_hole()
    clock.t = on_time[-1]["sent_at"] + 0.2  # where pushing the on-time batches left the app's clock
    last = batches[-1]["sent_at"]
    run_job_now(ctx, "rollups", now=last + 300)
    minutes_before = _stored(engine, Rollup1m)
    ctx.settings.storage.raw_retention_h = 1.0
    push_all(client, token, late)
    run_job_now(ctx, "rollups", now=last + 360)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(RollupLate)).scalar_one() == 0
        oldest = conn.execute(select(func.min(SampleRow.ts_ms))).scalar_one()
    assert oldest >= (last + 360 - 3600) * 1000 - 1  # deleted by retention, not kept forever
    assert _stored(engine, Rollup1m) == minutes_before  # buckets without complete raw are left as they were
