"""The evaluator's inputs return exactly what a direct read of storage returns, while reading only
new rows between evaluations and extending each series' running sum over them; late rows (spool
replays, through this app process or another) appear at the next evaluation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import TypeAdapter

from app.alerts.inputs import SeriesInputs
from app.derived.series_cache import cache_for
from app.storage.engine import open_database
from app.storage.ingest_store import IngestWriter
from app.storage.raw_store import raw_points_from, series_meta
from kvcore.protocol import PushBatch
from kvcore.series import indexed

NAME = "vllm:prompt_tokens_total"


def _push(writer: IngestWriter, seq: int, ts: float, value: float) -> None:
    from tests.conftest import make_batch

    b = make_batch(seq, ts, samples=[(NAME, {"model_name": "m", "engine": "0"}, value)])
    writer.write(TypeAdapter(PushBatch).validate_python(b), ts)


def _direct(engine: Any, start: float, end: float) -> list[tuple[float, float]]:
    (m,) = series_meta(engine, [NAME], instance_id=1)
    return raw_points_from(engine, {m.id: start - 120}, end)[m.id]


def _rebased(cum: Sequence[float]) -> list[float]:
    """A running sum kept across evaluations starts where the trimmed points begin: differences
    are what a rule reads."""
    return [c - cum[0] for c in cum]


def test_incremental_reads_match_a_direct_read(engine: Any, clock: Any) -> None:
    w = IngestWriter(engine)
    t0 = clock()
    inputs = SeriesInputs(engine)
    read_before = cache_for(engine).points_read
    for step in range(60):
        _push(w, step + 1, t0 + 5 * step, 100.0 * step if step != 30 else 7.0)  # one reset
        now = t0 + 5 * step
        (got,) = inputs.get(NAME, now - 120, now, instance_id=1)
        assert got.points == _direct(engine, now - 120, now)
        ref = indexed({}, got.points)
        assert got.cum is not None and _rebased(got.cum) == pytest.approx(ref.cum) and got.reset_idx == ref.reset_idx
    full_rows = sum(len(_direct(engine, t0 + 5 * s - 120, t0 + 5 * s)) for s in range(60))
    assert cache_for(engine).points_read - read_before == 60 < full_rows  # each evaluation read only the new row
    assert (inputs.recomputed, inputs.extended) == (1, 59)  # the running sum too, across the reset


def test_late_rows_show_up_at_the_next_read(engine: Any, clock: Any, settings: Any) -> None:
    w = IngestWriter(engine)
    t0 = clock()
    for i in range(10):
        _push(w, i + 1, t0 + 10 * i, 10.0 * i)
    inputs = SeriesInputs(engine)
    end = t0 + 90
    assert len(inputs.get(NAME, end - 300, end, instance_id=1)[0].points) == 10
    _push(w, 99, t0 + 45, 45.0)  # replayed from a spool, older than what the cache has
    (got,) = inputs.get(NAME, end - 300, end + 1, instance_id=1)
    assert len(got.points) == 11 and got.points == _direct(engine, end - 300, end + 1)
    assert got.cum is not None and _rebased(got.cum) == pytest.approx(indexed({}, got.points).cum)
    # a replay through another app process (its own engine and writer) shows as well
    other = open_database(settings.effective_database_url)
    try:
        _push(IngestWriter(other), 100, t0 + 25, 25.0)
    finally:
        other.dispose()
    (got,) = inputs.get(NAME, end - 300, end + 2, instance_id=1)
    assert len(got.points) == 12 and got.points == _direct(engine, end - 300, end + 2)
    assert got.cum is not None and _rebased(got.cum) == pytest.approx(indexed({}, got.points).cum)
