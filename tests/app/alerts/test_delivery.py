"""Webhook, ntfy, Slack and Discord payloads against a real local receiver; retries with backoff;
a dead channel never blocks the others (nor evaluation, which sends nothing itself)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from app.alerts.channels import snapshot
from app.alerts.delivery import DeliveryConfig, backoff_s, run_deliveries
from app.settings import AlertChannel
from app.storage import alerts_store as store
from tests.app.alerts.receiver import Receiver, receiver
from tests.paths import REPO

ALERT = {
    "id": 4,
    "key": "offload_thrash|instance:2",
    "rule": "offload_thrash",
    "severity": "critical",
    "state": "firing",
    "host": "rig1",
    "instance_url": "http://127.0.0.1:8000",
    "instance_id": 2,
    "model": "m",
    "simulated": True,
    "opened_at": 1000.0,
    "fired_at": 1300.0,
    "resolved_at": None,
    "value": 0.0,
    "baseline": None,
    "message": "stored 30 GiB, loaded back 0.00 GiB",
    "hints": [{"kind": "offload_saturated", "message": "full"}],
}


@pytest.fixture
def hook() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


def _queue(engine: Any, channel: str, now: float, event: str = "firing") -> int:
    snap = snapshot(ALERT, event, base_url="http://kvscope.lan:8080")
    (did,) = store.add_deliveries(engine, None, [store.NewDelivery(channel, event, snap)], now)
    return did


def test_webhook_body_is_the_documented_json(engine: Any, hook: Receiver, clock: Any) -> None:
    ch = AlertChannel(name="w", kind="webhook", url=hook.url + "/in", headers={"Authorization": "Bearer x"})
    _queue(engine, "w", clock())
    assert run_deliveries(engine, [ch], clock(), DeliveryConfig()).sent == 1
    (req,) = hook.requests
    assert req.path == "/in" and req.headers["authorization"] == "Bearer x"
    assert req.headers["content-type"] == "application/json"
    body = req.json()
    assert body["version"] == "1" and body["source"] == "kvscope" and body["event"] == "firing"
    assert body["sent_at"] == clock()
    a = body["alert"]
    assert {k: a[k] for k in ("id", "rule", "title", "severity", "instance", "host", "simulated", "value")} == {
        "id": 4,
        "rule": "offload_thrash",
        "title": "Offload thrash",
        "severity": "critical",
        "instance": "http://127.0.0.1:8000",
        "host": "rig1",
        "simulated": True,
        "value": 0.0,
    }
    assert a["hints"] == [{"kind": "offload_saturated", "message": "full"}]
    assert a["url"] == "http://kvscope.lan:8080/alerts/4"


def test_ntfy_slack_discord_formats(engine: Any, hook: Receiver, clock: Any) -> None:
    chans = [
        AlertChannel(name="n", kind="ntfy", url=hook.url + "/kvscope-topic"),
        AlertChannel(name="s", kind="slack", url=hook.url + "/slack"),
        AlertChannel(name="d", kind="discord", url=hook.url + "/discord"),
    ]
    for c in chans:
        _queue(engine, c.name, clock())
    assert run_deliveries(engine, chans, clock(), DeliveryConfig()).sent == 3
    by = {r.path: r for r in hook.requests}
    n = by["/kvscope-topic"]
    assert n.headers["title"] == "[FIRING] Offload thrash on http://127.0.0.1:8000 [simulated]"
    assert n.headers["priority"] == "urgent" and n.headers["tags"] == "warning"
    assert n.headers["click"] == "http://kvscope.lan:8080/alerts/4"
    assert b"likely cause: full" in n.body
    assert by["/slack"].json()["text"].startswith("[FIRING] Offload thrash")
    assert by["/discord"].json()["content"].startswith("[FIRING] Offload thrash")


def test_failures_retry_with_backoff_and_stay_visible(engine: Any, hook: Receiver, clock: Any) -> None:
    ch = AlertChannel(name="w", kind="webhook", url=hook.url)
    cfg = DeliveryConfig(retry_base_s=10, retry_max_s=60, max_attempts=5)
    assert [backoff_s(n, cfg) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 60, 60]
    t = clock()
    did = _queue(engine, "w", t)
    hook.status = 500
    rep = run_deliveries(engine, [ch], t, cfg)
    assert (rep.sent, rep.retrying) == (0, 1)
    row = store.get_delivery(engine, did)
    assert row["status"] == "pending" and row["attempts"] == 1
    assert row["next_attempt_at"] == t + 10 and row["last_error"].startswith("HTTP 500")
    assert run_deliveries(engine, [ch], t + 9, cfg).retrying == 0  # not due yet: no request
    assert len(hook.requests) == 1
    assert run_deliveries(engine, [ch], t + 10, cfg).retrying == 1
    assert store.get_delivery(engine, did)["next_attempt_at"] == t + 10 + 20
    hook.status = 200
    assert run_deliveries(engine, [ch], t + 30, cfg).sent == 1
    row = store.get_delivery(engine, did)
    assert row["status"] == "sent" and row["attempts"] == 3 and row["sent_at"] == t + 30
    assert len(hook.requests) == 3


def test_gives_up_after_max_attempts(engine: Any, clock: Any) -> None:
    ch = AlertChannel(name="dead", kind="webhook", url="http://127.0.0.1:9/refused", timeout_s=2)
    cfg = DeliveryConfig(retry_base_s=1, retry_max_s=1, max_attempts=3)
    t = clock()
    did = _queue(engine, "dead", t)
    for i in range(3):
        run_deliveries(engine, [ch], t + 10 * i, cfg)
    row = store.get_delivery(engine, did)
    assert row["status"] == "failed" and row["attempts"] == 3 and "ConnectError" in row["last_error"]
    assert store.due_deliveries(engine, t + 1000) == []


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung endpoint)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        yield int(srv.getsockname()[1])
    finally:
        stop.set()
        th.join(5)
        for c in conns:
            c.close()
        srv.close()


def test_a_hung_channel_costs_one_timeout_and_never_starves_the_others(
    engine: Any, hook: Receiver, clock: Any, silent_port: int
) -> None:
    hung = AlertChannel(name="hung", kind="webhook", url=f"http://127.0.0.1:{silent_port}/", timeout_s=0.3)
    good = AlertChannel(name="good", kind="slack", url=hook.url + "/ok")
    t = clock()
    for _ in range(3):
        _queue(engine, "hung", t)
    _queue(engine, "good", t)
    rep = run_deliveries(engine, [hung, good], t, DeliveryConfig())
    assert rep.sent == 1 and rep.retrying == 1 and rep.skipped == 2  # one timeout, then the channel is skipped
    assert "Timeout" in rep.errors[0]
    assert [r.path for r in hook.requests] == ["/ok"]


def test_evaluation_sends_nothing_itself(engine: Any, hook: Receiver, clock: Any) -> None:
    from pydantic import TypeAdapter

    from app.alerts.evaluate import EvalConfig, Evaluator
    from app.storage.ingest_store import IngestWriter
    from kvcore.protocol import PushBatch
    from tests.conftest import make_batch

    IngestWriter(engine).write(TypeAdapter(PushBatch).validate_python(make_batch(1, clock())), clock())
    ch = AlertChannel(name="w", kind="webhook", url=hook.url)
    rep = Evaluator(engine, rule_settings={}, channels=[ch], config=EvalConfig()).run(clock() + 600)
    assert rep.fired == 1  # agent_stale
    assert hook.requests == []  # queued, not sent: the delivery job sends
    assert [d["status"] for d in store.list_deliveries(engine, channel="w")] == ["pending"]


def test_unknown_channel_fails_visibly(engine: Any, clock: Any) -> None:
    did = _queue(engine, "removed", clock())
    rep = run_deliveries(engine, [], clock(), DeliveryConfig())
    assert rep.failed == 1
    assert "no longer configured" in store.get_delivery(engine, did)["last_error"]


def test_firing_alerts_are_refreshed_to_alertmanager_until_resolved(engine: Any, hook: Receiver, clock: Any) -> None:
    """Alertmanager expires an alert not re-sent before its endsAt: the evaluation queues a re-send
    of each firing alert every resend_s (endsAt = now + 4 x resend_s), none while an earlier one
    is still unsent, none while silenced."""
    from pydantic import TypeAdapter

    from app.alerts.evaluate import EvalConfig, Evaluator
    from app.storage.ingest_store import IngestWriter
    from kvcore.protocol import PushBatch
    from tests.conftest import make_batch

    t0 = clock()
    IngestWriter(engine).write(TypeAdapter(PushBatch).validate_python(make_batch(1, t0)), t0)
    am = AlertChannel(name="am", kind="alertmanager", url=hook.url)
    cfg = DeliveryConfig(resend_s=60)
    ev = Evaluator(engine, rule_settings={}, channels=[am], config=EvalConfig(resend_s=60))

    def tick(dt: float) -> None:
        ev.run(t0 + dt)
        run_deliveries(engine, [am], t0 + dt, cfg)

    for dt in (600, 630, 660, 700):
        tick(dt)
    events = [d["event"] for d in reversed(store.list_deliveries(engine, channel="am"))]
    assert events == ["firing", "refresh"]  # at 600, then 660 (60 s later); not at 630 nor 700
    body = hook.requests[-1].json()[0]
    assert hook.requests[-1].path == "/api/v2/alerts"
    assert body["labels"]["alertname"] == "kvscope_agent_stale"
    assert body["endsAt"] == "2027-01-15T08:15:00.000000Z"  # t0 + 660 + 4 x 60 s
    # while Alertmanager is down, refreshes do not pile up behind the unsent one
    hook.status = 503
    for dt in (730, 800, 900, 1000):
        tick(dt)
    assert [d["event"] for d in store.list_deliveries(engine, channel="am")].count("refresh") == 2
    hook.status = 200
    tick(1100)  # the waiting refresh goes out
    store.add_silence(engine, now=t0, until=t0 + 10_000, rule="agent_stale")
    before = len(store.list_deliveries(engine, channel="am"))
    for dt in (1200, 1300, 1400):
        tick(dt)
    assert len(store.list_deliveries(engine, channel="am")) == before  # silenced: no more refreshes


def test_documented_webhook_body_matches_what_is_sent() -> None:
    """docs/alerts.md shows the generic webhook body: same keys as the code sends."""
    import json
    import re

    from app.alerts.channels import webhook_body

    doc = (REPO / "docs" / "alerts.md").read_text()
    block = re.search(r"### Generic webhook.*?```json\n(.*?)```", doc, re.S)
    assert block, "the webhook example is missing from docs/alerts.md"
    documented = json.loads(block.group(1))
    sent = webhook_body(snapshot(ALERT, "firing", base_url="http://x"), 1.0)
    assert set(documented) == set(sent)
    assert set(documented["alert"]) == set(sent["alert"])
