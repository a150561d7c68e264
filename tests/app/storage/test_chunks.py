"""Raw samples sealed into chunks: the encoding round-trips every float and timestamp, sealing is
invisible to every read (raw points, counter increases, rollups, last values), late and repeated
samples after sealing are merged once, and the retention by time and by disk budget."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine, func, select

from app.ingest.parse import parse_batch
from app.settings import StorageSettings
from app.storage import chunk_codec, chunk_reads
from app.storage.chunk_seal import CHUNK_BYTES, seal_head
from app.storage.engine import open_database
from app.storage.ingest_store import IngestWriter, count_samples
from app.storage.models import OpenChunk, SampleChunk, SampleRow, Series
from app.storage.raw_store import counter_increases, raw_points_from
from app.storage.rollup_models import Rollup1m
from app.storage.rollups import rollup_buckets, run_rollups
from app.storage.series_index import last_values
from app.storage.store_budget import apply_budget, raw_cut_ms, store_usage
from tests.app.dashboard.recorded import recorded_batches

T0 = 1_800_000_000.0


def test_a_chunk_gives_back_exactly_the_timestamps_and_float_bits_it_was_given() -> None:
    rng = random.Random(3)
    for n in (1, 2, 3, 17, 960, 5000):
        ts, t = [], 1_800_000_000_000
        for _ in range(n):
            t += rng.choice([1000, 1000, 1001, 999, 5000, 1, 86_400_000, 2**40])
            ts.append(t)
        values = [
            rng.choice([0.0, -0.0, 1.5, math.inf, -math.inf, 1e308, 5e-324, rng.uniform(-1e9, 1e9), float(n)])
            for _ in range(n)
        ]
        got_ts, got_v = chunk_codec.decode(chunk_codec.encode(ts, values))
        assert got_ts == ts
        assert [math.copysign(1, v) for v in got_v] == [math.copysign(1, v) for v in values]
        assert got_v == values
    nan_ts, nan_v = chunk_codec.decode(chunk_codec.encode([5, 6], [math.nan, 1.0]))
    assert nan_ts == [5, 6] and math.isnan(nan_v[0]) and nan_v[1] == 1.0


def test_a_chunk_refuses_no_samples_and_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="1 to"):
        chunk_codec.encode([], [])
    with pytest.raises(ValueError, match="1 to"):
        chunk_codec.encode([1, 2], [1.0])


def _push(engine: Engine, batches: list[dict[str, Any]], writer: IngestWriter | None = None) -> IngestWriter:
    writer = writer or IngestWriter(engine)
    for b in batches:
        now = b["sent_at"] + 0.5
        writer.write(parse_batch(json.dumps(b).encode(), now, max_future_skew_s=60, max_past_age_s=1e9), now)
    return writer


def _everything(engine: Engine, now: float) -> dict[str, Any]:
    """Every read the app makes of raw samples, for every series."""
    with engine.connect() as conn:
        ids = sorted(int(s) for (s,) in conn.execute(select(Series.id)))
        kinds = {int(s): str(k) for s, k in conn.execute(select(Series.id, Series.kind))}
        last = last_values(conn, ids)
    counters = {s for s, k in kinds.items() if k == "counter"}
    start, end = T0 - 4 * 3600, now
    return {
        "raw": raw_points_from(engine, dict.fromkeys(ids, start), end),
        "raw_mid": raw_points_from(engine, dict.fromkeys(ids, T0 - 2 * 3600 + 0.5), T0 - 3600 + 0.25),
        "increases": counter_increases(engine, sorted(counters), T0 - 2 * 3600 + 17, T0 - 1800),
        "1m": rollup_buckets(engine, ids, counters, "1m", start, end),
        "1h": rollup_buckets(engine, ids, counters, "1h", start, end),
        "last": last,
        "count": count_samples(engine),
    }


@pytest.fixture
def two_stores(tmp_path: Path) -> tuple[Engine, Engine, list[dict[str, Any]]]:
    batches = recorded_batches(T0 - 3 * 3600, 1500, interval=7.0, reset_at=700)
    a = open_database(f"sqlite:///{tmp_path / 'a.db'}")
    b = open_database(f"sqlite:///{tmp_path / 'b.db'}")
    return a, b, batches


def test_sealing_between_pushes_changes_no_read_of_points_increases_rollups_or_last_values(
    two_stores: tuple[Engine, Engine, list[dict[str, Any]]],
) -> None:
    a, b, batches = two_stores
    wa, wb = IngestWriter(a), IngestWriter(b)
    # a late stretch (a spool replayed) and a repeated one (another seq, other values) come after
    # the samples around them were sealed
    late = batches[300:360]
    ordered = batches[:300] + batches[360:]
    repeated = [{**x, "seq": 10_000 + i} for i, x in enumerate(batches[100:130])]
    for x in repeated:
        for sc in x["scrapes"]:
            sc["samples"] = [{**s, "value": s["value"] + 1.0} for s in sc["samples"]]
    for i in range(0, len(ordered), 100):
        part = ordered[i : i + 100]
        _push(a, part, wa)
        _push(b, part, wb)
        now = part[-1]["sent_at"] + 1
        run_rollups(a, now, raw_retention_s=1e9, m1_retention_s=1e9, h1_retention_s=1e9)
        run_rollups(b, now, raw_retention_s=1e9, m1_retention_s=1e9, h1_retention_s=1e9)
        seal_head(b, now, batch=7)
    for extra in (late, repeated):
        _push(a, extra, wa)
        _push(b, extra, wb)
    now = batches[-1]["sent_at"] + 1
    before = _everything(b, now)  # late samples still in the head, among sealed ones
    seal_head(b, now + 3600)  # everything into chunks, the late ones merged
    for eng in (a, b):
        run_rollups(eng, now + 600, raw_retention_s=1e9, m1_retention_s=1e9, h1_retention_s=1e9)
    with b.connect() as conn:
        assert conn.execute(select(func.count()).select_from(SampleRow)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(SampleChunk)).scalar_one() > 10
        biggest = conn.execute(select(func.max(func.length(SampleChunk.data)))).scalar_one()
    assert biggest <= CHUNK_BYTES
    want = _everything(a, now)
    got = _everything(b, now)
    assert before["raw"] == want["raw"]  # (the count is of rows: the repeats are not merged yet)
    for key in want:
        assert got[key] == want[key], key
    assert want["count"] == 1500 * len(batches[0]["scrapes"][0]["samples"]) + 1500 * len(batches[0]["host_samples"])


def test_a_sample_pushed_again_after_sealing_keeps_its_first_value(tmp_path: Path) -> None:
    engine = open_database(f"sqlite:///{tmp_path / 'k.db'}")
    batches = recorded_batches(T0, 40, interval=5.0)
    _push(engine, batches)
    seal_head(engine, T0 + 3600)
    again = {**batches[10], "seq": 999}
    again["scrapes"] = [{**sc, "samples": [{**s, "value": 12345.0} for s in sc["samples"]]} for sc in again["scrapes"]]
    _push(engine, [again])
    with engine.connect() as conn:
        sid = int(conn.execute(select(Series.id).where(Series.name == "vllm:prompt_tokens_total")).scalar_one())
    ts = round(batches[10]["scrapes"][0]["ts"] * 1000)
    first = next(s["value"] for s in batches[10]["scrapes"][0]["samples"] if s["name"] == "vllm:prompt_tokens_total")
    for _ in range(2):  # in the head beside the chunk, then merged by the next sealing
        with engine.connect() as conn:
            pts = chunk_reads.points(conn, {sid: (ts - 1, ts + 1)})[sid]
        assert pts == [(ts, first)]
        seal_head(engine, T0 + 7200)
    assert count_samples(engine) == 40 * (len(batches[0]["scrapes"][0]["samples"]) + len(batches[0]["host_samples"]))


def test_raw_retention_drops_whole_old_chunks_and_keeps_the_rollups(tmp_path: Path) -> None:
    engine = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    batches = recorded_batches(T0 - 3 * 3600, 1000, interval=10.0)
    _push(engine, batches)
    now = batches[-1]["sent_at"] + 300
    seal_head(engine, now)
    run_rollups(engine, now, raw_retention_s=3600, m1_retention_s=1e9, h1_retention_s=1e9)
    with engine.connect() as conn:
        oldest_end = conn.execute(select(func.min(SampleChunk.end_ms))).scalar_one()
        minutes = conn.execute(select(func.count()).select_from(Rollup1m)).scalar_one()
    assert oldest_end >= (now - 3600) * 1000
    assert minutes >= 2.5 * 60 * 60  # 66 series... at least the three hours of one series' minutes


def test_over_the_disk_budget_the_oldest_rolled_up_raw_samples_go_and_the_reader_uses_rollups(
    tmp_path: Path,
) -> None:
    engine = open_database(f"sqlite:///{tmp_path / 'b.db'}")
    batches = recorded_batches(T0 - 6 * 3600, 2000, interval=10.0)
    _push(engine, batches)
    now = batches[-1]["sent_at"] + 1
    seal_head(engine, now)
    run_rollups(engine, now, raw_retention_s=1e9, m1_retention_s=1e9, h1_retention_s=1e9)
    with engine.connect() as conn:
        rolled = int(conn.execute(select(func.max(Rollup1m.bucket_ms))).scalar_one())
        minutes = conn.execute(select(func.count()).select_from(Rollup1m)).scalar_one()
    usage = store_usage(engine, 0)
    assert usage.samples == count_samples(engine) and usage.room_bytes is None
    budget = usage.used_bytes - usage.chunk_payload_bytes // 2  # half the raw data must go
    rep = apply_budget(engine, budget, now)
    assert rep.samples_deleted > 0 and rep.used_after <= budget and not rep.over
    with engine.connect() as conn:
        cut = raw_cut_ms(conn)
        first = chunk_reads.first_ts(conn)
        assert conn.execute(select(func.count()).select_from(Rollup1m)).scalar_one() == minutes
        assert conn.execute(select(func.count()).select_from(OpenChunk)).scalar_one() > 0
        oldest_end = conn.execute(select(func.min(SampleChunk.end_ms))).scalar_one()
    # whole chunks went: what is left ends after the cut, and nothing not rolled up went
    assert cut is not None and first is not None and first < cut <= oldest_end and cut <= rolled + 60_000
    after = store_usage(engine, budget)
    assert after.room_bytes is not None and after.room_bytes >= 0
    # a budget below what the rollups alone take: raw goes down to the unrolled tail, no further
    rep = apply_budget(engine, 1, now)
    assert rep.over
    with engine.connect() as conn:
        left = chunk_reads.first_ts(conn)
        final_cut = raw_cut_ms(conn)
        oldest_end = conn.execute(select(func.min(SampleChunk.end_ms))).scalar_one()
    assert left is not None and final_cut is not None and final_cut <= rolled + 60_000  # the 1-minute watermark
    assert oldest_end is None or oldest_end >= final_cut  # every chunk wholly before the cut went

    from app.derived.series_reader import SeriesQuery, read_series

    q = SeriesQuery(
        ["vllm:prompt_tokens_total"],
        now - 5 * 3600,
        now,
        instance_id=1,
        tier="auto",
        now=now,
        raw_retention_s=48 * 3600,
    )
    assert read_series(engine, q)[0].tier == "1m"  # raw is gone there: rollups, not a gap


def test_the_budget_and_seal_interval_settings_refuse_values_out_of_range() -> None:
    with pytest.raises(ValidationError, match="budget_mb"):
        StorageSettings(budget_mb=-1)
    with pytest.raises(ValidationError, match="budget_mb"):
        StorageSettings(budget_mb=1e12)
    with pytest.raises(ValidationError, match="seal_interval_s"):
        StorageSettings(seal_interval_s=1)
    assert StorageSettings(budget_mb=512).budget_mb == 512


@pytest.mark.both_databases
def test_on_either_database_sealing_changes_no_read_and_merges_late_and_repeated_samples(engine: Engine) -> None:
    batches = recorded_batches(T0 - 3 * 3600, 700, interval=10.0, reset_at=300)
    writer = _push(engine, batches[:200] + batches[260:])
    now = batches[-1]["sent_at"] + 1
    run_rollups(engine, now, raw_retention_s=1e9, m1_retention_s=1e9, h1_retention_s=1e9)
    seal_head(engine, now, batch=9)
    again = [{**x, "seq": 50_000 + i} for i, x in enumerate(batches[50:60])]
    _push(engine, batches[200:260] + again, writer)  # late, then repeated after sealing
    want = _everything(engine, now)
    seal_head(engine, now + 3600)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(SampleRow)).scalar_one() == 0
    got = _everything(engine, now)
    per_batch = len(batches[0]["scrapes"][0]["samples"]) + len(batches[0]["host_samples"])
    assert got["count"] == 700 * per_batch == want["count"] - 10 * per_batch
    for key in want:
        if key != "count":
            assert got[key] == want[key], key


@pytest.mark.both_databases
def test_on_either_database_the_scrape_gap_read_is_the_end_of_the_full_read_wherever_the_samples_lie(
    engine: Engine,
) -> None:
    """chunk_reads.tail_ts (the charts' scrape-gap read) against the full read of the same range:
    samples in several sealed chunks, in the open chunk and in the head, late ones merged into
    chunks; the series with the most sealed chunks, so that the read has to go back chunk by chunk."""
    batches = recorded_batches(T0 - 3 * 3600, 1500, interval=7.0)
    writer = _push(engine, batches[:600] + batches[800:1200])
    now = batches[-1]["sent_at"] + 1
    seal_head(engine, now, batch=9)
    _push(engine, batches[600:800] + batches[1200:], writer)  # late into sealed chunks, then a head
    seal_head(engine, batches[1300]["sent_at"], batch=9)  # part of the new ones sealed, the rest stay rows
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(SampleRow)).scalar_one() > 0
        sid, sealed = conn.execute(
            select(SampleChunk.series_id, func.count())
            .group_by(SampleChunk.series_id)
            .order_by(func.count().desc(), SampleChunk.series_id)
        ).first() or (0, 0)
        assert sealed >= 3
        spans = [
            (int((T0 - 4 * 3600) * 1000), int(now * 1000)),
            (int(batches[500]["sent_at"] * 1000), int(batches[1250]["sent_at"] * 1000)),
            (int(batches[1400]["sent_at"] * 1000), int(now * 1000)),
        ]
        for lo, hi in spans:
            full = [t for t, _ in chunk_reads.points(conn, {sid: (lo, hi)})[sid]]
            assert len(full) > 30
            for limit in (1, 7, 30, len(full) // 2, len(full), len(full) + 50):
                assert chunk_reads.tail_ts(conn, sid, lo, hi, limit) == full[-limit:], (lo, hi, limit)
        assert chunk_reads.tail_ts(conn, sid, int(now * 1000) + 1, int(now * 1000) + 5, 10) == []
