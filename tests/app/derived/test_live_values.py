"""The live-range memo (app.derived.live) gives exactly what a full computation gives.

A recorded workload (jittered scrape gaps, a counter restart, a stretch of pushes held back and
replayed late like an agent's spool) goes through the real ingest API refresh by refresh; after
each refresh every chart of a named range (memoised) is compared with the same range asked as a
custom range (computed from every point), value for value.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import pytest

from app.derived.instance_charts import CHARTS
from app.derived.live import LiveValues
from app.derived.panels import make_scope
from app.derived.worth import compute_worth
from app.storage.series_store import get_instance
from tests.app.dashboard.recorded import push_all, recorded_batches

T0 = 1_800_000_000.0
HELD = range(150, 158)  # these pushes arrive late, after an "outage"
NAMED_RANGES = (("15m", 900.0), ("1h", 3600.0))  # (range, its span in seconds)


def _chart(client: Any, key: str, params: dict[str, Any]) -> dict[str, Any]:
    r = client.get(f"/api/v1/instances/1/charts/{key}", params=params)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _same_figure(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["empty"] == b["empty"]
    assert a["notes"] == b["notes"]
    assert (a["step"], a["points"], a["tier"]) == (b["step"], b["points"], b["tier"])
    if a["figure"] is None:
        assert b["figure"] is None
        return
    da, db = a["figure"]["data"], b["figure"]["data"]
    assert [t.get("name") for t in da] == [t.get("name") for t in db]
    for ta, tb in zip(da, db, strict=True):
        assert ta.get("x") == tb.get("x"), ta.get("name")
        assert ta.get("y") == tb.get("y"), ta.get("name")
    assert a["figure"]["layout"].get("shapes") == b["figure"]["layout"].get("shapes")


@pytest.mark.slow  # replays hundreds of batches, reading charts between pushes
@pytest.mark.both_databases
def test_named_ranges_reuse_final_values_and_match_a_full_computation(
    client: Any, app: Any, token: str, clock: Any
) -> None:
    """Every named range of NAMED_RANGES at every refresh of one replay: the ranges are read one
    after the other at each refresh, as by a dashboard with both open."""
    batches = recorded_batches(T0, 320, interval=2.0, reset_at=170)
    live = app.state.ctx.peek_state(LiveValues)
    assert isinstance(live, LiveValues)
    used = {name: [0, 0] for name, _ in NAMED_RANGES}  # evaluations per range: [incremental, full]
    held: list[dict[str, Any]] = []
    i = 0
    refreshes = 0
    while i < len(batches):
        chunk = []
        t_end = batches[i]["sent_at"] + 15.0
        while i < len(batches) and batches[i]["sent_at"] <= t_end:
            (held if i in HELD else chunk).append(batches[i])
            i += 1
        if held and i > max(HELD) + 60:  # the spool replays, two minutes later (past the freeze lag)
            chunk = held + chunk
            held = []
        push_all(client, token, chunk)
        clock.t = batches[i - 1]["sent_at"] + 0.5
        refreshes += 1
        if refreshes % 3 and i < len(batches):
            continue  # not every push round is a refresh: memos must cope with any gap
        now = clock.t
        for range_name, span in NAMED_RANGES:
            incremental, full_evals = live.incremental, live.full
            for key in CHARTS:
                named = _chart(client, key, {"range": range_name})
                full = _chart(client, key, {"range": "custom", "start": now - span, "end": now})
                _same_figure(named, full)
            used[range_name][0] += live.incremental - incremental
            used[range_name][1] += live.full - full_evals
    for range_name, (incremental, full_evals) in used.items():
        assert incremental > 0, f"{range_name}: the memo was never used"
        assert full_evals > 0, range_name


def _worth_and_panels(engine: Any, live: LiveValues | None, now: float) -> tuple[Any, dict[str, Any]]:
    inst = get_instance(engine, 1)
    assert inst is not None
    sc = make_scope(engine, inst, start=now - 900, end=now, now=now, state="up", raw_retention_s=86400, live=live)
    panels = {k: [(t.name, t.y) for t in fn(sc).traces] for k, fn in CHARTS.items()}
    return compute_worth(sc), panels


@pytest.mark.slow  # replays hundreds of batches, reading charts between pushes
@pytest.mark.both_databases
def test_worth_and_sparkline_grids_match_with_the_memo(
    client: Any, app: Any, token: str, engine: Any, clock: Any
) -> None:
    batches = recorded_batches(T0, 200, interval=3.0, reset_at=90)
    live = LiveValues(freeze_lag_s=10.0)
    for k in range(0, len(batches), 7):
        push_all(client, token, batches[k : k + 7], clock)
        now = batches[min(k + 6, len(batches) - 1)]["sent_at"] + 0.5
        w_live, p_live = _worth_and_panels(engine, live, now)
        w_full, p_full = _worth_and_panels(engine, None, now)
        assert p_live == p_full
        for field, a in asdict(w_live).items():
            b = asdict(w_full)[field]
            if isinstance(a, float) and isinstance(b, float):
                assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), field
            else:
                assert a == b, field
    assert live.incremental > 0


def test_memo_values_hold_for_their_write_generation_only_and_are_bounded() -> None:
    live = LiveValues(freeze_lag_s=10.0, max_values=10)
    live.store(1, 1.0, 2.0, "rate", 100.0, [1.0, None, 3.0], gen=0)
    memo = live.lookup(1, 1.0, 2.0, "rate", 0)
    assert memo is not None and memo.first_t == 100.0 and math.isnan(memo.values[1])
    assert live.final_until(1, 1.0, 2.0, 0) == 102.0
    # a late write moved the series' generation: its values are forgotten, whatever their age
    assert live.final_until(1, 1.0, 2.0, 1) is None
    assert live.lookup(1, 1.0, 2.0, "rate", 0) is None and live.size == 0
    # a computation that read before the late write stores under the old generation: not used
    live.store(1, 1.0, 2.0, "rate", 100.0, [1.0], gen=1)
    live.store(1, 1.0, 2.0, "gauge", 100.0, [1.0], gen=0)
    assert live.lookup(1, 1.0, 2.0, "gauge", 1) is None and live.lookup(1, 1.0, 2.0, "rate", 1) is not None
    # no time-to-live: values are kept as long as the generation holds
    assert live.final_until(1, 1.0, 2.0, 1) == 100.0
    # bounded: the least recently used series go first
    for sid in range(2, 8):
        live.store(sid, 1.0, 2.0, "rate", 0.0, [1.0, 2.0, 3.0], gen=0)
    assert live.size <= 10
    assert live.lookup(7, 1.0, 2.0, "rate", 0) is not None and live.lookup(2, 1.0, 2.0, "rate", 0) is None


def test_rate_series_equals_rate_at_at_every_instant() -> None:
    """The walking rate_series (steps summed per window) gives rate_at's value at every instant."""
    import random

    from app.derived.rates import rate_at, rate_series

    rng = random.Random(3)
    for _ in range(50):
        t, v, pts = 0.0, 0.0, []
        for _ in range(rng.randint(0, 300)):
            t += round(rng.uniform(0.2, 3.0), 3)
            v = rng.uniform(0, 50) if rng.random() < 0.03 else v + rng.choice([0.0, rng.uniform(0, 1e9)])
            pts.append((t, v))
        step, window = rng.choice([1.0, 3.0, 30.0]), rng.choice([2.0, 5.0, 60.0])
        got = rate_series(pts, 0.0, t + 5, step, window)
        want = [(g, rate_at(pts, g, window)) for g, _ in got]
        assert got == want
