"""The series cache under the reader (app.derived.series_cache) gives exactly what a direct read
of storage gives: on random data with late samples, counter resets, sealing into chunks and a
raw retention cut, written by two app processes (two engines and writers), with reads of every
kind of range in between; a late push through the other process is seen at the next read; and
the cache stays within its bound."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import TypeAdapter
from sqlalchemy import Engine

from app.derived.series_cache import SeriesCache, cache_for
from app.derived.series_reader import SeriesQuery, read_series
from app.storage.chunk_seal import seal_head
from app.storage.engine import open_database
from app.storage.ingest_store import IngestWriter
from app.storage.raw_store import raw_points_from, series_meta
from app.storage.rollups import run_rollups
from app.storage.series_generation import raw_watermarks
from kvcore.protocol import PushBatch
from tests.conftest import make_batch

T0 = 1_800_000_000.0
NAMES = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_requests_running"]
ENGINES = ("0", "1")


def _push(writer: IngestWriter, seq: int, ts: float, values: dict[str, float], now: float) -> None:
    samples = [(n, {"model_name": "m", "engine": e}, v + int(e)) for n, v in values.items() for e in ENGINES]
    types = {"vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter"}
    b = make_batch(seq, ts, samples=samples, types=types)
    writer.write(TypeAdapter(PushBatch).validate_python(b), now)


def _direct(engine: Engine, lo: float, hi: float) -> dict[int, list[tuple[float, float]]]:
    metas = series_meta(engine, NAMES, instance_id=1)
    return raw_points_from(engine, dict.fromkeys((m.id for m in metas), lo), hi)


def _cached(engine: Engine, lo: float, hi: float) -> dict[int, list[tuple[float, float]]]:
    return {s.series_id: s.points for s in read_series(engine, SeriesQuery(NAMES, lo, hi, instance_id=1))}


@pytest.mark.both_databases
def test_cached_reads_equal_direct_reads_on_random_data_written_by_two_processes(settings: Any, engine: Any) -> None:
    rng = random.Random(25)
    other = open_database(settings.effective_database_url)  # a second app process
    try:
        writers = [IngestWriter(engine), IngestWriter(other)]
        cache_for(engine).clear()
        counters = {n: 0.0 for n in NAMES}
        t = T0
        pushed: list[float] = []
        compared = late = 0
        for step in range(400):
            seq = step + 1
            if pushed and rng.random() < 0.12:  # a late sample, older than the newest, through either process
                ts = rng.uniform(max(T0, t - 900), t) + 0.0005
                late += 1
            else:
                t += rng.uniform(0.5, 4.0)
                ts = t
            for n in NAMES:
                if n.endswith("_total"):
                    counters[n] = 0.0 if rng.random() < 0.03 else counters[n] + rng.uniform(0, 50)  # resets
                else:
                    counters[n] = float(rng.randint(0, 9))
            _push(writers[rng.random() < 0.4], seq, ts, dict(counters), now=t + 1)
            pushed.append(ts)
            if step % 50 == 49:
                seal_head(engine, t + 1, keep_ms=30_000)  # older samples move into chunks
            if step == 250:  # a retention cut: samples before it deleted (chunks straddling it stay)
                run_rollups(engine, t + 1, raw_retention_s=300, m1_retention_s=86400, h1_retention_s=86400 * 30)
                with engine.connect() as conn:
                    assert raw_watermarks(conn).kept_from_ms is not None
            for _ in range(2):  # reads of every kind: live-like, earlier starts, ranges in the past
                kind = rng.random()
                if kind < 0.5:
                    lo, hi = t - rng.choice([60, 300, 900]), t + rng.choice([0, 1, 5])
                elif kind < 0.8:
                    lo = rng.uniform(T0 - 10, t)
                    hi = rng.uniform(lo, t + 2)
                else:
                    lo, hi = T0 - 100, t
                assert _cached(engine, lo, hi) == _direct(engine, lo, hi), (step, lo, hi)
                compared += 1
        assert late > 20 and compared == 800
        cache = cache_for(engine)
        assert cache.points_served > 3 * cache.points_read  # most points came from memory
    finally:
        other.dispose()


def test_a_late_push_through_another_process_is_seen_at_the_next_read(settings: Any, engine: Any) -> None:
    w = IngestWriter(engine)
    for i in range(20):
        _push(w, i + 1, T0 + 10 * i, {NAMES[0]: 10.0 * i}, now=T0 + 10 * i)
    end = T0 + 200
    before = _cached(engine, T0 - 10, end)
    assert [len(p) for p in before.values()] == [20, 20]
    other = open_database(settings.effective_database_url)
    try:
        _push(IngestWriter(other), 99, T0 + 55, {NAMES[0]: 55.0}, now=end)  # a spool replayed there
    finally:
        other.dispose()
    after = _cached(engine, T0 - 10, end)
    assert [len(p) for p in after.values()] == [21, 21]
    assert after == _direct(engine, T0 - 10, end)


def test_the_cache_stays_within_its_bound_and_forgets_idle_series(engine: Any, clock: Any) -> None:
    w = IngestWriter(engine)
    names = [f"kvscope:test_gauge_{i}" for i in range(10)]
    for i in range(20):
        b = make_batch(i + 1, T0 + i, samples=[(n, {}, float(i)) for n in names])
        w.write(TypeAdapter(PushBatch).validate_python(b), T0 + i)
    clock.t = 0.0
    cache = SeriesCache(max_points=50, idle_s=120.0, sweep_s=60.0, clock=clock)
    metas = series_meta(engine, names, instance_id=1)
    direct = raw_points_from(engine, dict.fromkeys((m.id for m in metas), T0), T0 + 30)
    for _ in range(3):
        for m in metas:  # one series at a time: each read fits, all of them do not
            with engine.connect() as conn:
                assert cache.read(conn, [m], {m.id: T0}, T0 + 30, None) == {m.id: direct[m.id]}
            assert cache.size <= 50
        with engine.connect() as conn:  # all at once: more than the bound, read and not kept
            assert cache.read(conn, metas, dict.fromkeys((m.id for m in metas), T0), T0 + 30, None) == direct
        assert cache.size <= 50
    # points before every recent read's start are trimmed; series not read for idle_s go
    m = metas[-1]
    for t in (61.0, 122.0, 183.0):  # two sweeps after the last read from T0
        clock.t = t
        with engine.connect() as conn:
            assert cache.read(conn, [m], {m.id: T0 + 10}, T0 + 30, None)[m.id] == direct[m.id][10:]
    held = cache.held(m.id)
    assert held is not None and held[2] == 10
    clock.t = 400.0
    with engine.connect() as conn:
        cache.read(conn, [metas[0]], {metas[0].id: T0}, T0 + 30, None)
    assert cache.held(m.id) is None and cache.size == 20
