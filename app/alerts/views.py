"""What the alert pages and the JSON API show alike: an alert as JSON, its value with units, the
banner, silences (validated), and the alert part's evaluator and delivery settings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException

from app.alerts.catalog import BY_NAME
from app.alerts.delivery import DELIVERY_INTERVAL_S, DeliveryConfig
from app.alerts.evaluate import Evaluator
from app.alerts.silencing import is_silenced
from app.context import AppContext
from app.storage import alerts_store as store
from app.storage.alert_rows import AlertRow, SilenceRow
from app.web.ids import MAX_DB_ID

MAX_SILENCE_MIN = 60 * 24 * 30


@dataclass
class AlertsState:
    """The alert part's state in the app (AppContext.state): its evaluator and last reports."""

    evaluator: Evaluator
    last_report: Any = None
    last_delivery_report: Any = None


def alerts_state(ctx: AppContext) -> AlertsState:
    got = ctx.peek_state(AlertsState)
    if got is None:
        raise RuntimeError("the alerts part is not installed")
    return got


def evaluator(ctx: AppContext) -> Evaluator:
    return alerts_state(ctx).evaluator


def delivery_config(ctx: AppContext) -> DeliveryConfig:
    return DeliveryConfig(base_url=ctx.settings.alerts.public_url, run_budget_s=max(5.0, DELIVERY_INTERVAL_S * 6))


def alert_json(row: AlertRow, silences: Sequence[SilenceRow], now: float) -> dict[str, Any]:
    """An alert as the API and the pages show it (a JSON body)."""
    spec = BY_NAME.get(str(row["rule"]))
    return {
        "id": row["id"],
        "rule": row["rule"],
        "title": spec.title if spec else row["rule"],
        "severity": row["severity"],
        "state": row["state"],
        "since": row["since"],
        "opened_at": row["opened_at"],
        "fired_at": row["fired_at"],
        "resolved_at": row["resolved_at"],
        "instance": row["instance_id"],
        "instance_url": row["instance_url"],
        "host": row["host"],
        "host_id": row["host_id"],
        "model": row["model"],
        "simulated": bool(row["simulated"] or False),
        "value": row["value"],
        "baseline": row["baseline"],
        "message": row["message"],
        "hints": row["hints"] or [],
        "value_text": spec.format(row["value"], "value") if spec else "",
        "baseline_text": spec.format(row["baseline"], "baseline") if spec else "",
        "acked": row["acked_at"] is not None,
        "acked_at": row["acked_at"],
        "silenced": row["state"] != "resolved"
        and is_silenced(silences, str(row["rule"]), row["instance_id"], row["host_id"], now),
        # opened while kvscope itself was changing the instance (a rollout, an A/B experiment)
        "expected": str((row["labels"] or {}).get("expected") or "") or None,
    }


def alert_value(rule: str, value: object, which: str = "value") -> str:
    """A rule's value (or baseline) with its unit, for the pages."""
    spec = BY_NAME.get(str(rule))
    if spec is None:
        return "" if value is None else str(value)
    return spec.format(value, which)


def banner(ctx: AppContext) -> dict[str, Any]:
    """What the banner on every page shows: firing alerts, minus acknowledged and silenced ones."""
    now = ctx.now()
    try:
        firing = store.list_alerts(ctx.engine, states=["firing"], limit=50)
        silences = store.active_silences(ctx.engine, now)
    except Exception:  # the banner must never break a page
        return {"count": 0, "alerts": [], "quiet": 0}
    loud = [
        a
        for a in firing
        if a["acked_at"] is None
        and not (a["labels"] or {}).get("expected")
        and not is_silenced(silences, a["rule"], a["instance_id"], a["host_id"], now)
    ]
    return {
        "count": len(loud),
        "alerts": [alert_json(a, silences, now) for a in loud[:5]],
        "quiet": len(firing) - len(loud),
    }


def create_silence(
    ctx: AppContext, *, minutes: Any, rule: Any = None, instance: Any = None, host: Any = None, reason: Any = None
) -> int:
    """Validate and store a silence; HTTPException(400) with a message on bad input."""
    try:
        mins = float(minutes)
    except (TypeError, ValueError):
        raise HTTPException(400, "minutes must be a number (duration of the silence)") from None
    if not math.isfinite(mins) or mins <= 0 or mins > MAX_SILENCE_MIN:
        raise HTTPException(400, f"minutes must be > 0 and at most {MAX_SILENCE_MIN} (30 days)")
    rule_v = str(rule).strip() if rule not in (None, "") else None
    if rule_v is not None and rule_v not in BY_NAME:
        raise HTTPException(400, f"unknown rule {rule_v!r}")

    def _id(v: Any, what: str) -> int | None:
        if v in (None, ""):
            return None
        try:
            n = int(v)
        except (TypeError, ValueError, OverflowError):
            raise HTTPException(400, f"{what} must be an id (integer)") from None
        if isinstance(v, bool) or (not isinstance(v, str) and n != v) or not 1 <= n <= MAX_DB_ID:
            raise HTTPException(400, f"{what} must be an id from 1 to {MAX_DB_ID}")
        return n

    from app.storage.series_store import get_instance, list_hosts

    inst = _id(instance, "instance")
    if inst is not None and get_instance(ctx.engine, inst) is None:
        raise HTTPException(404, f"no instance {inst}")
    host_v = _id(host, "host")
    if host_v is not None and host_v not in {h["id"] for h in list_hosts(ctx.engine)}:
        raise HTTPException(404, f"no host {host_v}")
    now = ctx.now()
    return store.add_silence(
        ctx.engine,
        now=now,
        until=now + mins * 60,
        rule=rule_v,
        instance_id=inst,
        host_id=host_v,
        reason=str(reason or "")[:1000],
    )
