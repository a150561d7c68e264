"""Rollups: counter-correct increases across resets and run boundaries, min/max/mean, retention,
idempotence, and the tier a range reads from."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from sqlalchemy import func, select

from app.derived.grid import MAX_POINTS, make_grid
from app.derived.series_reader import DEFAULT_PX, pick_tier
from app.storage.models import SampleRow
from app.storage.rollup_buckets import HOUR_MS, MINUTE_MS, fold_hours, fold_minutes
from app.storage.rollup_models import Rollup1h, Rollup1m
from app.web.ranges import RANGES
from kvcore.series import increase
from tests.app.dashboard.recorded import recorded_batches
from tests.fed_databases import Feed


def _counter_with_resets(n: int, seed: int) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    out = []
    ts = 1_800_000_000_000
    v = 0.0
    for _ in range(n):
        ts += rng.randint(700, 9000)
        v = rng.uniform(0, 50) if rng.random() < 0.02 else v + rng.uniform(0, 100)  # 2 % restarts
        out.append((ts, v))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_bucket_increases_add_up_to_the_raw_increase_across_resets_and_runs(seed: int) -> None:
    samples = _counter_with_resets(3000, seed)
    assert any(b[1] < a[1] for a, b in itertools.pairwise(samples)), "the data has resets"
    whole, _ = fold_minutes(samples, None, counter=True)
    # the same samples folded in several job runs, carrying the last sample between runs
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(samples)), 7))
    parts: dict[int, Any] = {}
    carry = None
    for lo, hi in zip([0, *cuts], [*cuts, len(samples)], strict=True):
        # a run reads whole minutes: cut at a minute boundary
        chunk = samples[lo:hi]
        buckets, carry = fold_minutes(chunk, carry, counter=True)
        for ms, b in buckets:
            if ms in parts:  # a minute split across runs: increases add, extremes combine
                p = parts[ms]
                parts[ms] = type(b)(
                    b.ts,
                    p.n + b.n,
                    min(p.vmin, b.vmin),
                    max(p.vmax, b.vmax),
                    p.vsum + b.vsum,
                    b.vlast,
                    (p.inc or 0) + (b.inc or 0),
                )
            else:
                parts[ms] = b
    raw_increase = increase([(t / 1000, v) for t, v in samples])
    assert sum(b.inc for _, b in whole) == pytest.approx(raw_increase, rel=1e-12)
    assert sum(b.inc for b in parts.values()) == pytest.approx(raw_increase, rel=1e-12)
    assert all(b.inc is not None and b.inc >= 0 for _, b in whole)
    hours = fold_hours(whole)
    assert sum(b.inc for _, b in hours if b.inc is not None) == pytest.approx(raw_increase, rel=1e-12)
    assert sum(b.n for _, b in hours) == len(samples)


def test_minute_buckets_hold_min_max_mean_last() -> None:
    t0 = 1_800_000_000_000 - 1_800_000_000_000 % MINUTE_MS
    samples = [(t0 + 1000, 5.0), (t0 + 20_000, 1.0), (t0 + 59_999, 9.0), (t0 + 60_000, 2.0)]
    buckets, carry = fold_minutes(samples, None, counter=False)
    assert [ms for ms, _ in buckets] == [t0, t0 + MINUTE_MS]
    b = buckets[0][1]
    assert (b.n, b.vmin, b.vmax, b.mean, b.vlast, b.inc) == (3, 1.0, 9.0, 5.0, 9.0, None)
    assert carry == (t0 + 60_000, 2.0)
    # already folded samples are skipped on the next run
    again, _ = fold_minutes(samples, carry, counter=False)
    assert again == []


T0 = 1_800_000_000.0  # the clock fixture's start
# 1,000 recorded batches through the ingest API, fed once per session and copied per test
THREE_HOURS = Feed("rollups-3h", lambda: recorded_batches(T0 - 3 * 3600, 1000, interval=10.0, reset_at=450))


@pytest.mark.slow  # rolls up and expires 3 h of recorded scrapes
@pytest.mark.fed_database(THREE_HOURS)
def test_job_rolls_up_and_applies_retention(app: Any, client: Any, clock: Any) -> None:
    from app.web.jobs import run_job_now

    batches = THREE_HOURS.batches()
    clock.t = batches[-1]["sent_at"] + 0.2  # where pushing them left the app's clock
    engine = app.state.ctx.engine
    ctx = app.state.ctx
    last = batches[-1]["sent_at"]
    # raw samples not rolled up yet are never deleted, whatever the retention
    ctx.settings.storage.raw_retention_h = 0.001
    run_job_now(ctx, "rollups", now=last + 30)
    with engine.connect() as conn:
        left = conn.execute(select(func.min(SampleRow.ts_ms), func.count()).select_from(SampleRow)).one()
    assert left[1] > 0 and left[0] >= (last - 300) * 1000
    ctx.settings.storage.raw_retention_h = 48.0
    run_job_now(app.state.ctx, "rollups", now=last + 300)
    with engine.connect() as conn:
        m = conn.execute(select(func.count()).select_from(Rollup1m)).scalar_one()
        h = conn.execute(select(func.count()).select_from(Rollup1h)).scalar_one()
        raw_before = conn.execute(select(func.count()).select_from(SampleRow)).scalar_one()
    assert m > 0 and h > 0
    # idempotent: a second run at the same time writes nothing more
    run_job_now(app.state.ctx, "rollups", now=last + 300)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Rollup1m)).scalar_one() == m
    # the rolled-up increase of a counter equals its raw increase over the same whole minutes
    with engine.connect() as conn:
        sid = conn.execute(select(SampleRow.series_id).limit(1)).scalar_one()
        wm = conn.execute(select(func.max(Rollup1m.bucket_ms)).where(Rollup1m.series_id == sid)).scalar_one()
        raw = [
            (t / 1000, v)
            for t, v in conn.execute(
                select(SampleRow.ts_ms, SampleRow.value)
                .where(SampleRow.series_id == sid, SampleRow.ts_ms < wm + MINUTE_MS)
                .order_by(SampleRow.ts_ms)
            )
        ]
        incs = conn.execute(select(func.sum(Rollup1m.inc)).where(Rollup1m.series_id == sid)).scalar_one()
        hour_incs = conn.execute(select(func.sum(Rollup1h.inc)).where(Rollup1h.series_id == sid)).scalar_one()
        hour_wm = conn.execute(select(func.max(Rollup1h.bucket_ms)).where(Rollup1h.series_id == sid)).scalar_one()
        min_incs_to_hour = conn.execute(
            select(func.sum(Rollup1m.inc)).where(Rollup1m.series_id == sid, Rollup1m.bucket_ms < hour_wm + HOUR_MS)
        ).scalar_one()
    if incs is not None:  # a counter series
        assert incs == pytest.approx(increase(raw), rel=1e-12)
        assert hour_incs == pytest.approx(min_incs_to_hour, rel=1e-12)
    # retention: with 1 h of raw retention, raw samples older than that go
    ctx.settings.storage.raw_retention_h = 1.0
    run_job_now(ctx, "rollups", now=last + 1800)
    with engine.connect() as conn:
        oldest = conn.execute(select(func.min(SampleRow.ts_ms))).scalar_one()
        raw_after = conn.execute(select(func.count()).select_from(SampleRow)).scalar_one()
    assert 0 < raw_after <= raw_before
    assert oldest >= (last + 1800 - 3600) * 1000 - 1
    # 1-minute rollups expire after their own retention
    ctx.settings.storage.rollup_1m_retention_d = 0.05
    run_job_now(ctx, "rollups", now=last + 1800)
    with engine.connect() as conn:
        oldest_m, kept = conn.execute(select(func.min(Rollup1m.bucket_ms), func.count()).select_from(Rollup1m)).one()
    assert 0 < kept < m
    assert oldest_m >= (last + 1800 - 0.05 * 86400) * 1000


@pytest.mark.parametrize(
    ("name", "tier"), [("15m", "raw"), ("1h", "raw"), ("6h", "raw"), ("24h", "1m"), ("7d", "1m"), ("30d", "1h")]
)
def test_tier_per_range_and_at_most_one_point_per_pixel(name: str, tier: str) -> None:
    now = 1_800_000_000.0
    span = RANGES[name]
    assert pick_tier(now - span, now, now, 48 * 3600) == tier
    grid = make_grid(now - span, now, tier, DEFAULT_PX)
    assert len(grid.times) <= MAX_POINTS  # at most 600 points whatever the width asked
    assert len(grid.times) >= MAX_POINTS / 6 or name in ("15m",)


def test_old_custom_ranges_never_read_expired_raw_samples() -> None:
    now = 1_800_000_000.0
    assert pick_tier(now - 5 * 86400, now - 5 * 86400 + 3600, now, 48 * 3600) == "1m"
