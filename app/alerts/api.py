"""Alerts part of the app: install(app, ctx) adds

- GET  /api/v1/alerts                 JSON: rule, instance, state, since, value, baseline, hints ...
- GET  /api/v1/alerts/{id}            one alert with its transitions and deliveries
- POST /api/v1/alerts/{id}/ack        acknowledge (Content-Type: application/json; {"note": ...} optional)
- POST /api/v1/alerts/silences        {"minutes": 60, "rule": ..., "instance": id, "host": id, "reason": ...}
- the pages (/alerts, /alerts/{id}, /alerts/rules; app.alerts.pages), the banner Jinja global,
- the jobs "alerts" (evaluation, every settings.alerts.eval_interval_s) and "alerts_delivery".
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.alerts import pages
from app.alerts.catalog import BY_NAME
from app.alerts.delivery import DELIVERY_INTERVAL_S, run_deliveries
from app.alerts.evaluate import EvalConfig, Evaluator
from app.alerts.params import ParamError, validate_overrides
from app.alerts.views import (
    AlertsState,
    alert_json,
    alert_value,
    alerts_state,
    banner,
    create_silence,
    delivery_config,
    evaluator,
)
from app.auth.roles import OPERATOR, VIEWER, requires
from app.context import AppContext
from app.settings import Settings
from app.storage import alerts_store as store
from app.web import csrf
from app.web.deps import CtxDep, DbId, OptionalDbIdQuery
from app.web.jobs import register_job
from app.web.json_body import read_json
from kvscope.errors import UserError

STATE_FILTERS = {
    "open": ("pending", "firing"),
    "firing": ("firing",),
    "pending": ("pending",),
    "resolved": ("resolved",),
    "all": None,
}


def checked_rules(settings: Settings) -> dict[str, dict[str, Any]]:
    """The rule overrides, checked: the settings checked only their shape; which rules and
    parameters exist is this part's. Raises UserError (checked before the database is opened)."""
    try:
        return validate_overrides(settings.alerts.rules)
    except ParamError as exc:
        raise UserError(f"bad setting alerts.rules: {exc}") from None


def install(app: FastAPI, ctx: AppContext) -> None:
    s = ctx.settings.alerts
    rule_settings = checked_rules(ctx.settings)
    ev = Evaluator(
        ctx.engine,
        rule_settings=rule_settings,
        channels=s.channels,
        config=EvalConfig(
            interval_s=s.eval_interval_s,
            base_url=s.public_url,
            history_s=s.history_days * 86400,
            started_at=ctx.now(),
        ),
    )
    ctx.set_state(AlertsState(evaluator=ev))

    def eval_job(c: AppContext, now: float) -> None:
        alerts_state(c).last_report = evaluator(c).run(now)

    def delivery_job(c: AppContext, now: float) -> None:
        alerts_state(c).last_delivery_report = run_deliveries(
            c.engine, c.settings.alerts.channels, now, delivery_config(c)
        )

    register_job(ctx, "alerts", eval_job, s.eval_interval_s)
    register_job(ctx, "alerts_delivery", delivery_job, DELIVERY_INTERVAL_S)

    templates = ctx.templates
    templates.env.globals["alerts_banner"] = lambda: banner(ctx)
    templates.env.globals["alert_value"] = alert_value

    app.include_router(router)
    app.include_router(pages.router)


router = APIRouter()


@router.get("/api/v1/alerts")
@requires(VIEWER)
def list_alerts(
    ctx: CtxDep,
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


@router.get("/api/v1/alerts/{alert_id}")
@requires(VIEWER)
def get_alert(ctx: CtxDep, alert_id: DbId) -> JSONResponse:
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


@router.post("/api/v1/alerts/{alert_id}/ack")
@requires(OPERATOR)
async def ack(ctx: CtxDep, alert_id: DbId, request: Request) -> JSONResponse:
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


@router.post("/api/v1/alerts/silences")
@requires(OPERATOR)
async def silence(ctx: CtxDep, request: Request) -> JSONResponse:
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
