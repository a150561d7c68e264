"""The evaluator's series cache returns exactly what a fresh read returns, while reading only new
rows between evaluations; late rows (spool replays) appear after the periodic full refresh."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from app.alerts.inputs import SeriesCache
from app.derived.series_reader import SeriesQuery, read_series
from app.storage.ingest_store import IngestWriter
from kvcore.protocol import PushBatch

NAME = "vllm:prompt_tokens_total"


def _push(writer: IngestWriter, seq: int, ts: float, value: float) -> None:
    from tests.conftest import make_batch

    b = make_batch(seq, ts, samples=[(NAME, {"model_name": "m", "engine": "0"}, value)])
    writer.write(TypeAdapter(PushBatch).validate_python(b), ts)


def _fresh(engine: Any, start: float, end: float) -> list[tuple[float, float]]:
    (sp,) = read_series(engine, SeriesQuery([NAME], start - 120, end, instance_id=1))
    return sp.points


def test_incremental_reads_match_a_fresh_read(engine: Any, clock: Any) -> None:
    w = IngestWriter(engine)
    t0 = clock()
    cache = SeriesCache(engine, full_refresh_s=10_000)
    for step in range(60):
        _push(w, step + 1, t0 + 5 * step, 100.0 * step if step != 30 else 7.0)  # one reset
        now = t0 + 5 * step
        (got,) = cache.get(NAME, now - 120, now, instance_id=1)
        assert got.points == _fresh(engine, now - 120, now)
    full_rows = sum(len(_fresh(engine, t0 + 5 * s - 120, t0 + 5 * s)) for s in range(60))
    assert cache.rows_read == 60 < full_rows  # each evaluation read only the new row


def test_late_rows_show_up_after_the_full_refresh(engine: Any, clock: Any) -> None:
    w = IngestWriter(engine)
    t0 = clock()
    for i in range(10):
        _push(w, i + 1, t0 + 10 * i, 10.0 * i)
    cache = SeriesCache(engine, full_refresh_s=60)
    end = t0 + 90
    assert len(cache.get(NAME, end - 300, end, instance_id=1)[0].points) == 10
    _push(w, 99, t0 + 45, 45.0)  # replayed from a spool, older than what the cache has
    assert len(cache.get(NAME, end - 300, end + 1, instance_id=1)[0].points) == 10
    (got,) = cache.get(NAME, end - 300, end + 61, instance_id=1)
    assert len(got.points) == 11 and got.points == _fresh(engine, end - 300, end + 61)
