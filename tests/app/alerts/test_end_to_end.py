"""End to end through the real app: a simulator-shaped run pushed through the ingest API, the
evaluation and delivery jobs on a fake clock, a real webhook receiver on a loopback port.

Timing oracle (default rule parameters): a healthy mix caches 60% of prompt tokens; after the
switch to unique prompts the 5-minute window rate is 0.6 x (300 - tau) / 300, below the alert
threshold min(0.6 - 0.10, 0.6 x 0.75) = 0.45 once tau > 75 s. The alert must fire no later than
75 s + for (120 s) + 2 scrape intervals + 1 evaluation after the switch, and not before the `for`
window allows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.app.alerts.receiver import Receiver, receiver
from tests.app.alerts.rig import Rig
from tests.app.alerts.traffic import COLD, HEALTHY, UNIQUE
from tests.conftest import api_token

# each test backfills a day of history through the ingest API, then plays the live part
pytestmark = pytest.mark.slow
SCRAPE = 5.0
EVAL = 15.0
FOR = 120.0
CROSS = 75.0  # seconds after the switch when the window rate crosses the threshold


@pytest.fixture
def hook() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


@pytest.fixture
def rig(tmp_path: Any, clock: Any, hook: Receiver) -> Iterator[Rig]:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings
    from app.storage.tokens import create_token

    settings = load_settings(
        None,
        data_dir=str(tmp_path / "data"),
        run_scheduler=False,
        alert_eval_interval_s=EVAL,
        alert_channels=[{"name": "hook", "kind": "webhook", "url": hook.url + "/hook"}],
    )
    app = create_app(settings, clock=clock, start_jobs=False)
    ctx = app.state.ctx
    token = create_token(ctx.engine, "agent", clock(), host="rig1")
    with TestClient(app) as client:
        client.headers["Authorization"] = "Bearer " + api_token(ctx.engine)
        r = Rig(client, ctx, clock, token, scrape_s=SCRAPE, eval_s=EVAL)
        # align the live part on an evaluation tick, after a day of healthy history
        clock.t = 1_800_000_000.0 - 86400
        r.backfill(86400, 60.0, HEALTHY)
        assert round(r.t) % round(EVAL) == 0
        yield r
        ctx.engine.dispose()


def _overall(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in alerts if a["rule"] == "hit_rate_drop_overall"]


def _sent(hook: Receiver, rule: str = "hit_rate_drop_overall") -> list[dict[str, Any]]:
    return [r.json() for r in hook.requests if r.json()["alert"]["rule"] == rule]


def test_unique_prompts_fire_with_workload_shift_hint_then_resolve(rig: Rig, hook: Receiver) -> None:
    rig.live(600, HEALTHY)
    assert not _overall(rig.timeline[-1].alerts), "healthy traffic must not alert"
    switch = rig.t
    rig.live(420, UNIQUE)
    fired = rig.first("firing", after=switch)
    assert fired is not None, [(t.t - switch, [a["state"] for a in t.alerts]) for t in rig.timeline[-30:]]
    delay = fired.t - switch
    assert CROSS + FOR - SCRAPE <= delay <= CROSS + FOR + 2 * SCRAPE + EVAL, delay
    (alert,) = [a for a in fired.alerts if a["state"] == "firing"]
    assert alert["instance_url"] == "http://127.0.0.1:8000" and alert["simulated"] is True
    assert alert["value"] < 0.45 and alert["baseline"] == pytest.approx(0.6, abs=1e-6)
    assert [h["kind"] for h in alert["hints"]] == ["workload_shift"]
    # the pending transition is dated at the scrape where the condition began
    detail = rig.client.get(f"/api/v1/alerts/{alert['id']}").json()
    opened = next(t for t in detail["transitions"] if t["to_state"] == "pending")["ts"]
    assert CROSS <= opened - switch <= CROSS + SCRAPE
    # the webhook got exactly one firing notification with the hint
    firing = [s for s in _sent(hook) if s["event"] == "firing"]
    assert len(firing) == 1
    assert firing[0]["alert"]["rule"] == "hit_rate_drop_overall"
    assert firing[0]["alert"]["hints"][0]["kind"] == "workload_shift"
    assert firing[0]["alert"]["simulated"] is True

    # the diagnosis stays the same while the window fills with unique prompts
    for tick in rig.timeline:
        for a in _overall(tick.alerts):
            if tick.t > switch and a["state"] == "firing":
                assert [h["kind"] for h in a["hints"]] == ["workload_shift"], (tick.t - switch, a["hints"])
    back = rig.t
    rig.live(420, HEALTHY)
    resolved = rig.first("resolved", after=back)
    assert resolved is not None
    # window rate 0.6 x tau / 300 >= 0.45 after 225 s of healthy traffic
    assert resolved.t - back <= 225 + SCRAPE + EVAL
    assert [s["event"] for s in _sent(hook)] == ["firing", "resolved"]
    # the GPU tier dropped too (0.5 -> 0), with its own alert and notifications
    assert [s["event"] for s in _sent(hook, "hit_rate_drop_gpu")] == ["firing", "resolved"]
    assert rig.client.get("/api/v1/alerts", params={"state": "open"}).json()["alerts"] == []
    page = rig.client.get("/alerts")
    assert page.status_code == 200 and "hit_rate_drop_overall" in page.text


def test_restart_in_the_window_is_not_a_false_drop(rig: Rig, hook: Receiver) -> None:
    rig.live(600, HEALTHY)
    rig.server.restart()  # vLLM restarted; the same traffic keeps hitting a warm-equivalent cache
    rig.live(600, HEALTHY)
    assert all(not _overall(t.alerts) for t in rig.timeline), "a counter reset must not look like a drop"
    events = rig.client.get("/api/v1/events").json()["events"]
    assert any(e["kind"] == "counter_reset" for e in events)
    assert hook.requests == []


def test_cold_restart_carries_the_restart_hint_not_workload_shift(rig: Rig, hook: Receiver) -> None:
    rig.live(600, HEALTHY)
    restart = rig.t
    rig.server.restart()
    rig.live(180, COLD)  # a restarted server's prefix cache is empty until traffic repeats
    rig.live(420, HEALTHY)
    fired = rig.first("firing", after=restart)
    assert fired is not None
    (alert,) = [a for a in _overall(fired.alerts) if a["state"] == "firing"]
    kinds = [h["kind"] for h in alert["hints"]]
    assert "restart" in kinds and "workload_shift" not in kinds
    for tick in rig.timeline:
        for a in _overall(tick.alerts):
            assert "workload_shift" not in [h["kind"] for h in a["hints"]], (tick.t - restart, a["hints"])
    assert rig.first("resolved", after=fired.t) is not None
    sent = _sent(hook)
    assert [s["event"] for s in sent] == ["firing", "resolved"]
    assert "restart" in [h["kind"] for h in sent[0]["alert"]["hints"]]
