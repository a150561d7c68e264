"""The delivery job: sends queued notifications and retries failures with exponential backoff.
(Re-sends of firing alerts to Alertmanager are queued by the evaluation, under its CAS.)

Runs as its own scheduler job, so a dead channel (timeouts) never delays rule evaluation; within
one run, a channel that failed is skipped for the rest of the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import Engine

from app.alerts.channels import render
from app.settings import AlertChannel
from app.storage import alerts_store as store

log = logging.getLogger("kvscope.alerts.delivery")

DELIVERY_INTERVAL_S = 5.0  # queued notifications go out within this of their alert's change
# A failed notification is retried after RETRY_BASE_S, doubling up to RETRY_MAX_S, and given up
# after MAX_ATTEMPTS (about 1.5 h of a channel being down)
RETRY_BASE_S = 10.0
RETRY_MAX_S = 900.0
MAX_ATTEMPTS = 10
# Firing alerts are re-sent to Alertmanager this often: well inside its resolve_timeout (5 min)
RESEND_S = 60.0


@dataclass(frozen=True)
class DeliveryConfig:
    retry_base_s: float = RETRY_BASE_S
    retry_max_s: float = RETRY_MAX_S
    max_attempts: int = MAX_ATTEMPTS
    lease_s: float = 120.0
    resend_s: float = RESEND_S  # Alertmanager refresh interval for firing alerts
    run_budget_s: float = 30.0  # stop a run after this much wall time; the rest waits for the next
    base_url: str | None = None


@dataclass
class DeliveryReport:
    sent: int = 0
    retrying: int = 0
    failed: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)


def backoff_s(attempts: int, cfg: DeliveryConfig) -> float:
    """Delay before attempt `attempts + 1`: base, 2 x base, 4 x base ... capped."""
    return float(min(cfg.retry_max_s, cfg.retry_base_s * (2 ** max(0, attempts - 1))))


def send(
    channel: AlertChannel,
    payload: Mapping[str, Any],
    now: float,
    cfg: DeliveryConfig,
    transport: httpx.BaseTransport | None = None,
) -> str | None:
    """One HTTP attempt. None on success (2xx), else a one-line error."""
    req = render(channel, payload, now, resend_s=cfg.resend_s)
    try:
        with httpx.Client(timeout=channel.timeout_s, transport=transport, follow_redirects=False) as client:
            resp = client.request(req.method, req.url, headers=req.headers, content=req.body)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
    if 200 <= resp.status_code < 300:
        return None
    return f"HTTP {resp.status_code}: {resp.text[:300]}"


def run_deliveries(
    engine: Engine,
    channels: Sequence[AlertChannel],
    now: float,
    cfg: DeliveryConfig,
    *,
    transport: httpx.BaseTransport | None = None,
) -> DeliveryReport:
    report = DeliveryReport()
    by_name = {c.name: c for c in channels}
    dead: set[str] = set()
    t0 = time.monotonic()
    for d in store.due_deliveries(engine, now):
        if time.monotonic() - t0 > cfg.run_budget_s:
            break
        channel = by_name.get(d["channel"])
        if channel is None:
            if store.claim_delivery(engine, d["id"], now, cfg.lease_s):
                store.finish_delivery(
                    engine, d["id"], status="failed", now=now, error=f"channel {d['channel']!r} is no longer configured"
                )
                report.failed += 1
            continue
        if channel.name in dead:
            report.skipped += 1
            continue
        if not store.claim_delivery(engine, d["id"], now, cfg.lease_s):
            continue  # another process has it
        attempts = int(d["attempts"]) + 1
        err = send(channel, d["payload"], now, cfg, transport)
        if err is None:
            store.finish_delivery(engine, d["id"], status="sent", now=now)
            report.sent += 1
            continue
        dead.add(channel.name)
        report.errors.append(f"{channel.name}: {err}")
        if attempts >= cfg.max_attempts or d["event"] == "test":
            store.finish_delivery(engine, d["id"], status="failed", now=now, error=err)
            report.failed += 1
            log.warning("alert delivery %s to %s failed for good: %s", d["id"], channel.name, err)
        else:
            store.finish_delivery(
                engine, d["id"], status="pending", now=now, error=err, next_attempt_at=now + backoff_s(attempts, cfg)
            )
            report.retrying += 1
    return report


def send_test(
    engine: Engine,
    channel: AlertChannel,
    now: float,
    cfg: DeliveryConfig,
    *,
    transport: httpx.BaseTransport | None = None,
) -> tuple[int, str | None]:
    """ "Send test" from the UI: queue a test delivery, send it at once, record the outcome."""
    snap: dict[str, Any] = {
        "id": None,
        "rule": "test",
        "title": "kvscope test notification",
        "severity": "info",
        "state": "firing",
        "event": "test",
        "channel": channel.name,
        "message": f"Test from kvscope to channel {channel.name} ({channel.kind}). If you read this, it works.",
        "hints": [],
        "opened_at": now,
        "fired_at": now,
        "resolved_at": None,
        "host": None,
        "instance": None,
        "simulated": False,
        "url": (cfg.base_url.rstrip("/") + "/alerts") if cfg.base_url else None,
    }
    (did,) = store.add_deliveries(engine, None, [store.NewDelivery(channel.name, "test", snap)], now)
    if not store.claim_delivery(engine, did, now, cfg.lease_s):
        return did, "claimed by another process"
    err = send(channel, snap, now, cfg, transport)
    store.finish_delivery(engine, did, status="sent" if err is None else "failed", now=now, error=err)
    return did, err
