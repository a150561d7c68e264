"""Delivery to a REAL Alertmanager: kvscope posts to its v2 API and the test reads the alert back
(labels for routing and dedup, annotations with the hints), then resolves it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.alerts.channels import snapshot
from app.alerts.delivery import DeliveryConfig, run_deliveries, send_test
from app.settings import AlertChannel
from app.storage import alerts_store as store
from tests.app.alerts.alertmanager import Alertmanager, alertmanager
from tests.waits import wait_until

pytestmark = pytest.mark.alertmanager


@pytest.fixture
def am(tmp_path: Path) -> Iterator[Alertmanager]:
    with alertmanager(tmp_path / "am") as a:
        yield a


def _alert(now: float, state: str = "firing") -> dict[str, Any]:
    return {
        "id": 7,
        "key": "hit_rate_drop_overall|instance:3",
        "rule": "hit_rate_drop_overall",
        "severity": "warning",
        "state": state,
        "host": "rig1",
        "instance_url": "http://10.0.0.5:8000",
        "instance_id": 3,
        "model": "qwen3-8b",
        "simulated": True,
        "opened_at": now - 200,
        "fired_at": now - 60,
        "resolved_at": now if state == "resolved" else None,
        "value": 0.12,
        "baseline": 0.61,
        "message": "overall hit rate 12.0% over the last 5 min vs 61.0%",
        "hints": [{"kind": "workload_shift", "message": "workload shift: request rate 2.00/s -> 6.00/s (+200%)"}],
    }


def _ours(am: Alertmanager) -> list[dict[str, Any]]:
    return [a for a in am.alerts() if a["labels"].get("source") == "kvscope"]  # type: ignore[union-attr]


def test_firing_then_resolved_through_the_v2_api(am: Alertmanager, engine: Any) -> None:
    now = time.time()  # Alertmanager judges startsAt/endsAt against its own clock
    ch = AlertChannel(name="am", kind="alertmanager", url=am.url)
    cfg = DeliveryConfig(resend_s=60)
    store.add_deliveries(engine, None, [store.NewDelivery("am", "firing", snapshot(_alert(now), "firing"))], now)
    rep = run_deliveries(engine, [ch], now, cfg)
    assert rep.sent == 1, rep.errors
    (got,) = _ours(am)
    assert got["labels"] == {
        "alertname": "kvscope_hit_rate_drop_overall",
        "rule": "hit_rate_drop_overall",
        "severity": "warning",
        "source": "kvscope",
        "host": "rig1",
        "instance": "http://10.0.0.5:8000",
        "model": "qwen3-8b",
        "simulated": "true",
    }
    ann = got["annotations"]
    assert ann["hint_kinds"] == "workload_shift"
    assert "request rate 2.00/s -> 6.00/s" in ann["hints"]
    assert ann["value"] == "0.12" and ann["baseline"] == "0.61"
    assert got["status"]["state"] == "active"
    # the same alert again (a refresh) is deduplicated by its labels: still one alert
    store.add_deliveries(engine, None, [store.NewDelivery("am", "refresh", snapshot(_alert(now), "refresh"))], now)
    assert run_deliveries(engine, [ch], now, cfg).sent == 1
    assert len(_ours(am)) == 1
    # resolved: endsAt = resolve time; Alertmanager no longer lists it as active
    done = time.time()
    store.add_deliveries(
        engine, None, [store.NewDelivery("am", "resolved", snapshot(_alert(done, "resolved"), "resolved"))], done
    )
    assert run_deliveries(engine, [ch], done, cfg).sent == 1
    # Alertmanager applies the update asynchronously
    wait_until(lambda: _ours(am) == [], "Alertmanager to drop the resolved alert", timeout=10.0, interval=0.1)


def test_send_test_reaches_alertmanager(am: Alertmanager, engine: Any) -> None:
    ch = AlertChannel(name="am", kind="alertmanager", url=am.url + "/")
    _did, err = send_test(engine, ch, time.time(), DeliveryConfig())
    assert err is None
    (got,) = _ours(am)
    assert got["labels"]["alertname"] == "kvscope_test"


def test_bad_alertmanager_url_is_a_visible_failure(am: Alertmanager, engine: Any) -> None:
    ch = AlertChannel(name="am", kind="alertmanager", url=am.url + "/nothing-here")
    did, err = send_test(engine, ch, time.time(), DeliveryConfig())
    assert err is not None and err.startswith("HTTP 404")
    row = store.get_delivery(engine, did)
    assert row is not None and row["status"] == "failed" and row["last_error"] == err


def test_evaluated_alert_reaches_alertmanager_and_resolves(am: Alertmanager, engine: Any) -> None:
    """The whole path: ingest -> evaluation (agent_stale fires) -> queued delivery -> Alertmanager;
    the agent comes back -> resolved -> Alertmanager drops it."""
    from pydantic import TypeAdapter

    from app.alerts.evaluate import EvalConfig, Evaluator
    from app.storage.ingest_store import IngestWriter
    from kvcore.protocol import PushBatch
    from tests.conftest import make_batch

    now = time.time()
    writer = IngestWriter(engine)
    writer.write(TypeAdapter(PushBatch).validate_python(make_batch(1, now - 600)), now - 600)
    ch = AlertChannel(name="am", kind="alertmanager", url=am.url)
    ev = Evaluator(engine, rule_settings={}, channels=[ch], config=EvalConfig())
    assert ev.run(now).fired == 1
    assert run_deliveries(engine, [ch], now, DeliveryConfig()).sent == 1
    (got,) = _ours(am)
    assert got["labels"]["alertname"] == "kvscope_agent_stale" and got["labels"]["host"] == "rig1"
    assert got["labels"]["severity"] == "critical"
    back = time.time()
    writer.write(TypeAdapter(PushBatch).validate_python(make_batch(2, back)), back)  # the agent pushes again
    assert ev.run(back).resolved == 1
    assert run_deliveries(engine, [ch], back, DeliveryConfig()).sent == 1
    wait_until(lambda: _ours(am) == [], "Alertmanager to drop the resolved alert", timeout=10.0, interval=0.1)
