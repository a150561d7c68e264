"""Increases over a window that cuts between scrapes count from the last sample before it, so they
equal vLLM's own counter deltas (the counter at the last scrape in the window minus the counter
at the last scrape before it), on the raw tier in the database, on fetched raw points, and on the
1-minute rollups for windows on minute edges. Runs on SQLite and PostgreSQL.

The oracle is computed from the recorded counters alone (tests/app/dashboard/recorded.py): per scrape,
the new value minus the previous one, or the new value right after the known restart. The
recorded batches go in through the real IngestWriter once per session (tests/fed_databases.py);
each test reads (and rolls up) its own copy of that database.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.derived.grid_math import range_increase
from app.derived.panels import make_scope
from app.derived.series_reader import SeriesQuery, read_series
from app.storage.raw_store import counter_increases, series_meta
from app.storage.rollups import run_rollups
from app.storage.series_store import list_instances
from tests.app.dashboard.recorded import recorded_batches
from tests.fed_databases import Feed

T0 = 1_800_000_000.0
N = 160
RESET_AT = 90
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


def _value(batch: dict[str, Any], src: str) -> float:
    for s in batch["scrapes"][0]["samples"]:
        if s["name"] == "vllm:prompt_tokens_by_source_total" and s["labels"].get("source") == src:
            return float(s["value"])
    raise AssertionError(f"no {src} sample")


def _vllm_delta(batches: list[dict[str, Any]], src: str, start: float, end: float) -> float:
    """What vLLM's counter moved by between the last scrape before start and the last one <= end."""
    total = 0.0
    prev = 0.0
    for i, b in enumerate(batches):
        v = _value(b, src)
        step = v if i == RESET_AT else v - prev
        prev = v
        if start <= b["scrapes"][0]["ts"] <= end:
            total += step
    return total


# the recorded batches written by the real IngestWriter, once per session; each test gets a copy
RECORDED = Feed("window-edges", lambda: recorded_batches(T0, N, interval=5.0, reset_at=RESET_AT), via="writer")
pytestmark = pytest.mark.fed_database(RECORDED)


@pytest.fixture
def fed(engine: Any) -> tuple[Any, list[dict[str, Any]], dict[str, int]]:
    batches = RECORDED.batches()
    inst = list_instances(engine)[0]
    metas = series_meta(engine, ["vllm:prompt_tokens_by_source_total"], instance_id=int(inst["id"]))
    ids = {str(m.labels["source"]): m.id for m in metas}
    return engine, batches, ids


def _windows(batches: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """Windows whose edges fall between scrapes (inside the requests' gaps), some across the restart."""
    ts = [b["scrapes"][0]["ts"] for b in batches]
    rng = random.Random(3)
    out = []
    for _ in range(25):
        i = rng.randrange(1, N - 20)
        j = rng.randrange(i + 1, N - 1)
        start = ts[i - 1] + (ts[i] - ts[i - 1]) * rng.uniform(0.1, 0.9)
        end = ts[j] + (ts[j + 1] - ts[j]) * rng.uniform(0.1, 0.9)
        out.append((start, end))
    out.append((ts[RESET_AT - 1] + 0.5, ts[RESET_AT + 3] + 0.5))  # across the restart
    return out


def test_database_increases_equal_vllm_deltas_at_any_window_edge(fed: Any) -> None:
    engine, batches, ids = fed
    compared = 0
    for start, end in _windows(batches):
        got = counter_increases(engine, list(ids.values()), start, end)
        for src in SOURCES:
            want = _vllm_delta(batches, src, start, end)
            assert got[ids[src]] == pytest.approx(want, abs=1e-6), (src, start, end)
            compared += want > 0
    assert compared > 40  # the windows carried traffic


def test_the_first_request_of_a_window_is_not_lost(fed: Any) -> None:
    """The issue's case: a window starting just after a scrape still counts the requests that
    arrived between that scrape and the first one inside the window."""
    engine, batches, ids = fed
    ts = [b["scrapes"][0]["ts"] for b in batches]
    start, end = ts[10] + 0.01, ts[12] + 0.01  # two scrapes inside: 11 and 12
    got = counter_increases(engine, [ids["local_compute"]], start, end)[ids["local_compute"]]
    two_steps = _value(batches[12], "local_compute") - _value(batches[10], "local_compute")
    one_step = _value(batches[12], "local_compute") - _value(batches[11], "local_compute")
    assert got == pytest.approx(two_steps) and got > one_step


def test_scope_increases_equal_vllm_deltas_on_every_path(fed: Any) -> None:
    """Database fold (within raw retention), fetched raw points (beyond it), and whole 1-minute
    buckets all give vLLM's delta."""
    engine, batches, _ids = fed
    inst = list_instances(engine)[0]
    now = batches[-1]["sent_at"] + 120
    run_rollups(engine, now, raw_retention_s=1e9, m1_retention_s=1e9, h1_retention_s=1e9)
    for start, end in _windows(batches)[:8]:
        for retention in (1e9, 1.0):  # 1 s: the range is past raw retention, so points are folded here
            sc = make_scope(
                engine, inst, start=start, end=end, now=now, state="up", raw_retention_s=retention, tier="raw"
            )
            got = sc.range_increases(["vllm:prompt_tokens_by_source_total"], start, end)
            by = {lab["source"]: v for lab, v in got["vllm:prompt_tokens_by_source_total"]}
            for src in SOURCES:
                assert by[src] == pytest.approx(_vllm_delta(batches, src, start, end), abs=1e-6)
        # 1-minute rollups: a window on minute edges, each bucket counted from the sample before it
        m0 = (start // 60 + 1) * 60
        m1 = (end // 60) * 60
        if m1 <= m0:
            continue
        q = SeriesQuery(
            ["vllm:prompt_tokens_by_source_total"], m0, m1, instance_id=int(inst["id"]), lookback=60.0, tier="1m"
        )
        series = read_series(engine, q)
        for s in series:
            src = str(s.labels["source"])
            assert range_increase(s, m0, m1) == pytest.approx(_vllm_delta(batches, src, m0, m1 - 1e-3), abs=1e-6), (
                src,
                m0,
                m1,
            )


@pytest.mark.parametrize("rolled", [True, False], ids=["rolled-up", "raw-tail-only"])
def test_rollup_charts_count_window_edges_from_raw_samples(fed: Any, rolled: bool) -> None:
    """A range whose charts read 1-minute buckets still gets vLLM's delta at unaligned edges:
    whole buckets inside plus the two edge fragments from raw samples (rolled-up: buckets stored
    by the rollup job; raw-tail-only: the job has not run, buckets are folded from raw)."""
    engine, batches, _ids = fed
    inst = list_instances(engine)[0]
    now = batches[-1]["sent_at"] + 120
    if rolled:
        run_rollups(engine, now, raw_retention_s=1e9, m1_retention_s=1e9, h1_retention_s=1e9)
    compared = 0
    for start, end in _windows(batches):
        if end - start < 180:
            continue  # at least two whole minutes inside
        sc = make_scope(engine, inst, start=start, end=end, now=now, state="up", raw_retention_s=1e9, tier="1m")
        assert sc.grid.tier == "1m"
        got = sc.range_increases(["vllm:prompt_tokens_by_source_total"], start, end)
        by = {lab["source"]: v for lab, v in got["vllm:prompt_tokens_by_source_total"]}
        for src in SOURCES:
            assert by[src] == pytest.approx(_vllm_delta(batches, src, start, end), abs=1e-6), (src, start, end)
            compared += 1
    assert compared >= 30
