"""Alerts part of the app (issue 8): install(app, ctx) adds

- GET  /api/v1/alerts                 JSON: rule, instance, state, since, value, baseline, hints ...
- GET  /api/v1/alerts/{id}            one alert with its transitions and deliveries
- POST /api/v1/alerts/{id}/ack        acknowledge (Content-Type: application/json; {"note": ...} optional)
- POST /api/v1/alerts/silences        {"minutes": 60, "rule": ..., "instance": id, "host": id, "reason": ...}
- the pages (/alerts, /alerts/{id}, /alerts/rules; app.alerts.pages), the banner Jinja global,
- the jobs "alerts" (evaluation, every settings.alert_eval_interval_s) and "alerts_delivery".
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app import controller_csrf as csrf
from app.alerts.catalog import BY_NAME
from app.alerts.delivery import DeliveryConfig, run_deliveries
from app.alerts.evaluate import EvalConfig, Evaluator
from app.alerts.silencing import is_silenced
from app.api.ids import DbId, OptionalDbIdQuery
from app.api.json_body import read_json
from app.context import AppContext
from app.jobs import register_job
from app.storage import alerts_store as store

STATE_FILTERS = {
    "open": ("pending", "firing"),
    "firing": ("firing",),
    "pending": ("pending",),
    "resolved": ("resolved",),
    "all": None,
}
MAX_SILENCE_MIN = 60 * 24 * 30


def evaluator(ctx: AppContext) -> Evaluator:
    ev: Evaluator = ctx.extras["alerts.evaluator"]
    return ev


def delivery_config(ctx: AppContext) -> DeliveryConfig:
    s = ctx.settings
    return DeliveryConfig(
        retry_base_s=s.alert_retry_base_s,
        retry_max_s=s.alert_retry_max_s,
        max_attempts=s.alert_max_attempts,
        resend_s=s.alert_resend_s,
        base_url=s.alert_public_url,
        run_budget_s=max(5.0, s.alert_delivery_interval_s * 6),
    )


def alert_json(row: dict[str, Any], silences: list[dict[str, Any]], now: float) -> dict[str, Any]:
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
        "instance_url": row.get("instance_url"),
        "host": row.get("host"),
        "host_id": row["host_id"],
        "model": row.get("model"),
        "simulated": bool(row.get("simulated") or False),
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
        "expected": str((row.get("labels") or {}).get("expected") or "") or None,
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
        and not (a.get("labels") or {}).get("expected")
        and not is_silenced(silences, a["rule"], a["instance_id"], a["host_id"], now)
    ]
    return {
        "count": len(loud),
        "alerts": [alert_json(a, silences, now) for a in loud[:5]],
        "quiet": len(firing) - len(loud),
    }


def install(app: FastAPI, ctx: AppContext) -> None:
    s = ctx.settings
    ev = Evaluator(
        ctx.engine,
        rule_settings=s.alert_rules,
        channels=s.alert_channels,
        config=EvalConfig(
            interval_s=s.alert_eval_interval_s,
            nodata_resolve_s=s.alert_nodata_resolve_s,
            base_url=s.alert_public_url,
            resend_s=s.alert_resend_s,
            history_s=s.alert_history_days * 86400,
        ),
    )
    ctx.extras["alerts.evaluator"] = ev
    ctx.extras["alerts.last_report"] = None
    ctx.extras["alerts.last_delivery_report"] = None

    def eval_job(c: AppContext, now: float) -> None:
        c.extras["alerts.last_report"] = evaluator(c).run(now)

    def delivery_job(c: AppContext, now: float) -> None:
        c.extras["alerts.last_delivery_report"] = run_deliveries(
            c.engine, c.settings.alert_channels, now, delivery_config(c)
        )

    register_job(ctx, "alerts", eval_job, s.alert_eval_interval_s)
    register_job(ctx, "alerts_delivery", delivery_job, s.alert_delivery_interval_s)

    templates = ctx.extras.get("templates")
    if templates is None:
        from app.pages.templating import make_templates

        templates = make_templates()
        ctx.extras["templates"] = templates
    templates.env.globals["alerts_banner"] = lambda: banner(ctx)
    templates.env.globals["alert_value"] = alert_value

    app.include_router(api_router(ctx))
    from app.alerts import pages

    app.include_router(pages.router(ctx))


def api_router(ctx: AppContext) -> APIRouter:
    r = APIRouter()

    @r.get("/api/v1/alerts")
    def list_alerts(
        state: str = Query("open", description="open | firing | pending | resolved | all"),
        instance: OptionalDbIdQuery = None,
        rule: str | None = None,
        limit: int = Query(200, ge=1, le=5000),
    ) -> JSONResponse:
        if state not in STATE_FILTERS:
            raise HTTPException(400, f"state must be one of {', '.join(STATE_FILTERS)}")
        if rule is not None and rule not in BY_NAME:
            raise HTTPException(400, f"unknown rule {rule!r}; known: {', '.join(sorted(BY_NAME))}")
        now = ctx.now()
        rows = store.list_alerts(ctx.engine, states=STATE_FILTERS[state], instance_id=instance, rule=rule, limit=limit)
        silences = store.active_silences(ctx.engine, now)
        return JSONResponse({"now": now, "alerts": [alert_json(a, silences, now) for a in rows]})

    @r.get("/api/v1/alerts/{alert_id}")
    def get_alert(alert_id: DbId) -> JSONResponse:
        row = store.get_alert(ctx.engine, alert_id)
        if row is None:
            raise HTTPException(404, f"no alert {alert_id}")
        now = ctx.now()
        out = alert_json(row, store.active_silences(ctx.engine, now), now)
        out["transitions"] = [
            {k: t[k] for k in ("ts", "from_state", "to_state", "value", "message")}
            for t in store.list_transitions(ctx.engine, alert_id=alert_id)
        ]
        out["deliveries"] = [
            {
                k: d[k]
                for k in (
                    "id",
                    "channel",
                    "event",
                    "status",
                    "attempts",
                    "created_at",
                    "sent_at",
                    "next_attempt_at",
                    "last_error",
                )
            }
            for d in store.list_deliveries(ctx.engine, alert_id=alert_id)
        ]
        return JSONResponse(out)

    @r.post("/api/v1/alerts/{alert_id}/ack")
    async def ack(alert_id: DbId, request: Request) -> JSONResponse:
        csrf.require_json(request)  # a cross-site form cannot send JSON without a CORS preflight
        note = ""
        body = await request.body()
        if body:
            data = await read_json(request, 'body must be JSON, e.g. {"note": "looking"}')
            note = str(data.get("note", "")) if isinstance(data, dict) else ""
        if store.get_alert(ctx.engine, alert_id) is None:
            raise HTTPException(404, f"no alert {alert_id}")
        ok = await run_in_threadpool(store.acknowledge, ctx.engine, alert_id, ctx.now(), note)
        return JSONResponse({"acknowledged": ok, "already": not ok})

    @r.post("/api/v1/alerts/silences")
    async def silence(request: Request) -> JSONResponse:
        csrf.require_json(request)
        data = await read_json(request, 'body must be JSON: {"minutes": 60, "rule": ..., "instance": id}')
        if not isinstance(data, dict):
            raise HTTPException(400, "body must be a JSON object")
        sid = create_silence(
            ctx,
            minutes=data.get("minutes"),
            rule=data.get("rule"),
            instance=data.get("instance"),
            host=data.get("host"),
            reason=data.get("reason"),
        )
        return JSONResponse({"id": sid}, status_code=201)

    return r


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
            return int(v)
        except (TypeError, ValueError):
            raise HTTPException(400, f"{what} must be an id (integer)") from None

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
