"""Series write generations (app/storage/series_generation.py): a write of a sample older than its
series' newest moves that series' generation, whichever app process writes it; appends and
a duplicate of the newest instant does not; raw retention and the disk budget record their cut before they delete."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import Engine

from app.storage.engine import open_database
from app.storage.ingest_store import IngestWriter
from app.storage.raw_store import series_meta
from app.storage.rollups import run_rollups
from app.storage.series_generation import raw_watermarks
from app.storage.store_budget import apply_budget
from kvcore.protocol import PushBatch
from tests.conftest import make_batch

T0 = 1_800_000_000.0
A, B = "vllm:prompt_tokens_total", "vllm:generation_tokens_total"


def _push(writer: IngestWriter, seq: int, ts: float, names: tuple[str, ...] = (A, B)) -> None:
    b = make_batch(seq, ts, samples=[(n, {"engine": "0"}, 10.0 * seq) for n in names])
    writer.write(TypeAdapter(PushBatch).validate_python(b), ts)


def _gens(engine: Engine) -> dict[str, int]:
    return {m.name: m.write_gen for m in series_meta(engine, [A, B], instance_id=1)}


def test_only_a_sample_older_than_the_series_newest_moves_its_generation(engine: Any) -> None:
    w = IngestWriter(engine)
    for i in range(5):
        _push(w, i + 1, T0 + 10 * i)
    assert _gens(engine) == {A: 0, B: 0}  # appends
    _push(w, 6, T0 + 40, names=(A,))  # the newest instant again: the store keeps the first value
    assert _gens(engine) == {A: 0, B: 0}
    _push(w, 7, T0 + 15, names=(A,))  # late: older than A's newest
    assert _gens(engine) == {A: 1, B: 0}
    _push(w, 8, T0 + 50)
    _push(w, 9, T0 + 45, names=(B,))
    assert _gens(engine) == {A: 1, B: 1}


def test_a_write_through_another_process_is_judged_against_what_that_one_wrote(engine: Any, settings: Any) -> None:
    w = IngestWriter(engine)
    _push(w, 1, T0)
    other = open_database(settings.effective_database_url)  # a second app process
    try:
        w2 = IngestWriter(other)
        _push(w2, 2, T0 + 100)  # newer than anything: an append
        assert _gens(engine) == {A: 0, B: 0}
        _push(w, 3, T0 + 50)  # newer than what the first writer wrote, older than the second's
        assert _gens(engine) == {A: 1, B: 1}
        _push(w2, 4, T0 + 60)  # the second writer's own record is stale as well
        assert _gens(engine) == {A: 2, B: 2}
        _push(w, 5, T0 + 200)
        _push(w2, 6, T0 + 210)
        assert _gens(engine) == {A: 2, B: 2}
    finally:
        other.dispose()


def test_a_failed_push_leaves_no_record_behind(engine: Any) -> None:
    w = IngestWriter(engine)
    _push(w, 1, T0)
    bad = make_batch(2, T0 + 10, samples=[(f"m{i}", {}, 1.0) for i in range(50)])
    try:
        w.write(TypeAdapter(PushBatch).validate_python(bad), T0 + 10, limits=type(w.limits)(new_per_push=5))
    except ValueError:
        pass
    _push(w, 3, T0 + 20)
    assert _gens(engine) == {A: 0, B: 0}


def test_retention_and_the_budget_record_their_cut_before_deleting(engine: Any) -> None:
    w = IngestWriter(engine)
    for i in range(30):
        _push(w, i + 1, T0 + 60 * i)
    with engine.connect() as conn:
        assert raw_watermarks(conn).kept_from_ms is None
    now = T0 + 60 * 30
    run_rollups(engine, now, raw_retention_s=600, m1_retention_s=86400, h1_retention_s=86400 * 30)
    with engine.connect() as conn:
        marks = raw_watermarks(conn)
    assert marks.budget_cut_ms is None and marks.kept_from_ms is not None
    assert marks.kept_from_ms <= int((now - 600) * 1000)
    rep = apply_budget(engine, 1, now)  # a budget nothing fits in: cut as far as rolled up
    with engine.connect() as conn:
        after = raw_watermarks(conn)
    assert rep.cut_ms is not None and after.budget_cut_ms == rep.cut_ms
    assert after.kept_from_ms == max(rep.cut_ms, marks.kept_from_ms)
