"""Two app processes (two engines on one database) evaluating and delivering at the same time:
an alert opens once, each transition is written once, each notification is sent once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from app.alerts.delivery import DeliveryConfig, run_deliveries
from app.alerts.evaluate import EvalConfig, Evaluator
from app.settings import AlertChannel
from app.storage import alerts_store as store
from app.storage.engine import open_database
from app.storage.ingest_store import IngestWriter
from kvcore.protocol import PushBatch
from tests.app.alerts.receiver import Receiver, receiver

pytestmark = pytest.mark.both_databases


@pytest.fixture
def hook() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


@pytest.fixture
def engines(settings: Any) -> Iterator[tuple[Any, Any]]:
    a = open_database(settings.effective_database_url)
    b = open_database(settings.effective_database_url)
    yield a, b
    a.dispose()
    b.dispose()


def _seed(engine: Any, now: float, seq: int = 1) -> None:
    """One agent push (host rig1, one instance) at `now`."""
    from pydantic import TypeAdapter

    from tests.conftest import make_batch

    batch = TypeAdapter(PushBatch).validate_python(make_batch(seq, now))
    IngestWriter(engine).write(batch, now)


def _evaluator(engine: Any, channel: AlertChannel) -> Evaluator:
    # agent_stale fires at once (for_s 0) when the host stops pushing: an easy, exact trigger
    return Evaluator(engine, rule_settings={}, channels=[channel], config=EvalConfig())


def _race(funcs: list[Any]) -> list[Any]:
    barrier = threading.Barrier(len(funcs))
    out: list[Any] = [None] * len(funcs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            out[i] = funcs[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(funcs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


def test_two_processes_open_fire_and_notify_once(engines: tuple[Any, Any], clock: Any, hook: Receiver) -> None:
    a, b = engines
    t0 = clock()
    _seed(a, t0)
    ch = AlertChannel(name="hook", kind="webhook", url=hook.url)
    ev_a, ev_b = _evaluator(a, ch), _evaluator(b, ch)
    now = t0 + 600  # agent silent 600 s > 120 s
    reports = []
    for _ in range(5):  # several rounds at the same instant: still one alert, one notification
        reports += _race([lambda: ev_a.run(now), lambda: ev_b.run(now)])
    assert sum(r.fired for r in reports) == 1
    stale = [x for x in store.list_alerts(a, states=["firing"]) if x["rule"] == "agent_stale"]
    assert len(stale) == 1
    transitions = store.list_transitions(a, alert_id=stale[0]["id"])
    assert [t["to_state"] for t in reversed(transitions)] == ["pending", "firing"]
    deliveries = store.list_deliveries(a, alert_id=stale[0]["id"])
    assert [(d["event"], d["status"]) for d in deliveries] == [("firing", "pending")]
    # both processes deliver at the same time: one POST
    cfg = DeliveryConfig()
    rep = _race([lambda: run_deliveries(a, [ch], now, cfg), lambda: run_deliveries(b, [ch], now, cfg)])
    assert sum(r.sent for r in rep) == 1
    assert len(hook.requests) == 1 and hook.requests[0].json()["alert"]["rule"] == "agent_stale"


def test_two_processes_queue_one_alertmanager_refresh(engines: tuple[Any, Any], clock: Any) -> None:
    a, b = engines
    t0 = clock()
    _seed(a, t0)
    am = AlertChannel(name="am", kind="alertmanager", url="http://127.0.0.1:9/")
    ev_a = Evaluator(a, rule_settings={}, channels=[am], config=EvalConfig(resend_s=60))
    ev_b = Evaluator(b, rule_settings={}, channels=[am], config=EvalConfig(resend_s=60))
    ev_a.run(t0 + 600)
    (firing,) = store.list_deliveries(a, channel="am")
    store.finish_delivery(a, firing["id"], status="sent", now=t0 + 600)  # as if Alertmanager took it
    for k in range(1, 4):  # both evaluate when the refresh is due, several times
        _race([lambda k=k: ev_a.run(t0 + 600 + 60 * k), lambda k=k: ev_b.run(t0 + 600 + 60 * k)])
        refreshes = [d for d in store.list_deliveries(a, channel="am") if d["event"] == "refresh"]
        assert len(refreshes) == k  # exactly one more per due time, whichever process queued it
        (new,) = [d for d in refreshes if d["status"] == "pending"]
        store.finish_delivery(a, new["id"], status="sent", now=t0 + 600 + 60 * k)


def test_stale_version_loses_and_writes_nothing(engines: tuple[Any, Any], clock: Any) -> None:
    a, b = engines
    t0 = clock()
    _seed(a, t0)
    ch = AlertChannel(name="hook", kind="webhook", url="http://127.0.0.1:9/never")
    _evaluator(a, ch).run(t0 + 600)
    (row,) = store.open_alerts(b).values()
    # process A resolves it first ...
    assert store.cas_update(
        a,
        row["id"],
        row["version"],
        {"state": "resolved", "active_key": None},
        [store.TransitionRow("firing", "resolved", t0 + 700)],
        [store.NewDelivery("hook", "resolved", {"rule": "agent_stale"})],
        t0 + 700,
    )
    # ... process B, still holding the old version, loses: no second transition, no second delivery
    assert not store.cas_update(
        b,
        row["id"],
        row["version"],
        {"state": "resolved", "active_key": None},
        [store.TransitionRow("firing", "resolved", t0 + 701)],
        [store.NewDelivery("hook", "resolved", {"rule": "agent_stale"})],
        t0 + 701,
    )
    assert len([t for t in store.list_transitions(a, alert_id=row["id"]) if t["to_state"] == "resolved"]) == 1
    assert len([d for d in store.list_deliveries(a, alert_id=row["id"]) if d["event"] == "resolved"]) == 1
    # a new episode can open once the old one resolved (active_key released)
    assert store.open_alerts(a) == {}


def test_delivery_claim_is_exclusive(engines: tuple[Any, Any], clock: Any) -> None:
    a, b = engines
    now = clock()
    (did,) = store.add_deliveries(a, None, [store.NewDelivery("x", "test", {})], now)
    assert store.claim_delivery(a, did, now, 60)
    assert not store.claim_delivery(b, did, now, 60)
    assert store.claim_delivery(b, did, now + 61, 60)  # the first sender's lease ran out (crashed)


def test_a_target_that_fails_to_load_keeps_its_alerts(
    engines: tuple[Any, Any], clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = engines
    t0 = clock()
    _seed(a, t0)
    ev = Evaluator(a, rule_settings={}, channels=[], config=EvalConfig())
    ev.run(t0 + 600)
    assert [x["rule"] for x in store.open_alerts(a).values()] == ["agent_stale"]

    def broken(*_args: Any, **_kw: Any) -> Any:
        raise RuntimeError("database hiccup")

    monkeypatch.setattr(ev, "load", broken)
    rep = ev.run(t0 + 615)
    assert rep.errors and rep.resolved == 0  # no false "resolved" because a read failed
    assert [x["rule"] for x in store.open_alerts(a).values()] == ["agent_stale"]


def test_old_resolved_alerts_are_pruned(engines: tuple[Any, Any], clock: Any) -> None:
    a, _ = engines
    t0 = clock()
    _seed(a, t0)
    ch = AlertChannel(name="hook", kind="webhook", url="http://127.0.0.1:9/")
    ev = Evaluator(a, rule_settings={}, channels=[ch], config=EvalConfig(history_s=86400))
    ev.run(t0 + 600)  # agent_stale fires
    _seed(a, t0 + 700, seq=2)  # the agent is back
    ev.run(t0 + 700)  # resolves
    (row,) = store.list_alerts(a, states=["resolved"])
    assert store.list_transitions(a, alert_id=row["id"]) and store.list_deliveries(a, alert_id=row["id"])
    ev.run(t0 + 700 + 86400 + 10)  # an hour later than the last prune, a day after the resolve
    assert store.get_alert(a, row["id"]) is None
    assert store.list_transitions(a, alert_id=row["id"]) == []
    assert store.list_deliveries(a, alert_id=row["id"]) == []
