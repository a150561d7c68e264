"""Alert pages: list + history (/alerts), one alert (/alerts/{id}), rules and per-instance
overrides (/alerts/rules); form actions acknowledge, silence, expire silence, send test, save
overrides. Forms carry the signed CSRF token of app.web.csrf (and must come from the same
origin); they redirect back with a message."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from app.alerts import expected
from app.alerts.catalog import BY_NAME, RULES
from app.alerts.delivery import send_test
from app.alerts.evaluate import alert_key
from app.alerts.params import ParamError, coerce, effective
from app.alerts.views import alert_json, alerts_state, create_silence, delivery_config, evaluator
from app.auth.roles import OPERATOR, VIEWER, requires
from app.context import AppContext
from app.storage import alerts_store as store
from app.storage.alert_rows import DeliveryRow
from app.storage.series_store import get_instance, list_instances
from app.web import csrf
from app.web.deps import CtxDep, DbId, OptionalDbIdQuery


def _back(path: str, msg: str | None = None) -> RedirectResponse:
    url = path + (("&" if "?" in path else "?") + "msg=" + quote(msg[:300]) if msg else "")
    return RedirectResponse(url, status_code=303)


def _render(ctx: AppContext, request: Request, name: str, data: dict[str, Any]) -> HTMLResponse:
    token, new_cookie = csrf.issue(request, ctx.secret)
    data.setdefault("active_nav", "alerts")
    data.setdefault("now", ctx.now())
    data.setdefault("msg", request.query_params.get("msg"))
    data["csrf"] = token
    resp: HTMLResponse = ctx.templates.TemplateResponse(request, name, data)
    if new_cookie:
        csrf.set_cookie(resp, new_cookie)
    return resp


async def _checked_form(ctx: AppContext, request: Request) -> Any:
    """The posted form, after the same-origin and signed-token checks (app.web.csrf)."""
    form = await request.form()
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    return form


def _list_context(ctx: AppContext) -> dict[str, Any]:
    now = ctx.now()
    silences = store.active_silences(ctx.engine, now)
    open_rows = store.list_alerts(ctx.engine, states=["pending", "firing"], limit=500)
    history = store.list_transitions(ctx.engine, limit=200)
    channels: list[dict[str, Any]] = []
    failing: list[DeliveryRow] = []
    for c in ctx.settings.alerts.channels:
        last = store.list_deliveries(ctx.engine, channel=c.name, limit=5)
        channels.append({"cfg": c, "recent": last})
        failing.extend(d for d in last if d["status"] == "failed" or d["last_error"])
    instances = list_instances(ctx.engine)
    urls = {int(i["id"]): i.get("url") for i in instances}
    try:
        windows = expected.load_windows(ctx.engine, now - 3600.0, now)
    except Exception:  # the page never breaks on this
        windows = {}
    changes = sorted(
        ({**w.as_dict(), "instance_url": urls.get(w.instance_id)} for ws in windows.values() for w in ws),
        key=lambda w: -float(w["start"]),
    )[:20]
    return {
        "changes": changes,
        "settle_s": expected.SETTLE_S,
        "open": [alert_json(a, silences, now) for a in open_rows],
        "history": history,
        "silences": silences,
        "channels": channels,
        "failing": failing,
        "rules": RULES,
        "instances": instances,
        "simulated": any(i.get("simulated") for i in instances),
        "eval_interval": ctx.settings.alerts.eval_interval_s,
    }


router = APIRouter(include_in_schema=False)


@router.get("/alerts", response_class=HTMLResponse)
@requires(VIEWER)
def alerts_page(ctx: CtxDep, request: Request) -> HTMLResponse:
    data = _list_context(ctx)
    return _render(ctx, request, "alerts/list.html", data)


@router.get("/fragments/alerts/banner", response_class=HTMLResponse)
@requires(VIEWER)
def banner_fragment(ctx: CtxDep, request: Request) -> HTMLResponse:
    return _render(ctx, request, "alerts/_banner.html", {})


@router.get("/alerts/rules", response_class=HTMLResponse)
@requires(VIEWER)
def rules_page(ctx: CtxDep, request: Request, instance: OptionalDbIdQuery = None) -> HTMLResponse:
    instances = list_instances(ctx.engine)
    overrides = store.all_overrides(ctx.engine)
    chosen = instance if instance is not None else (instances[0]["id"] if instances else None)
    rows = []
    report = alerts_state(ctx).last_report
    results = getattr(report, "results", None) or {}
    chosen_host = next((int(i["host_id"]) for i in instances if i["id"] == chosen), None)
    for spec in RULES:
        ov = overrides.get((chosen, spec.name), {}) if chosen is not None else {}
        eff = effective(spec.name, evaluator(ctx).rule_settings, ov)
        base = effective(spec.name, evaluator(ctx).rule_settings, None)
        target = chosen if spec.scope == "instance" else chosen_host
        # what the rule said at the last evaluation (e.g. "learning: ..."), with its units
        now_said = results.get(alert_key(spec.name, spec.scope, target)) if target is not None else None
        rows.append({"spec": spec, "effective": eff, "base": base, "override": ov, "now": now_said})
    return _render(
        ctx,
        request,
        "alerts/rules.html",
        {
            "rows": rows,
            "instances": instances,
            "chosen": chosen,
            "simulated": any(i.get("simulated") for i in instances),
        },
    )


@router.post("/alerts/rules/{instance_id}/{rule}")
@requires(OPERATOR)
async def save_override(ctx: CtxDep, instance_id: DbId, rule: str, request: Request) -> Response:
    form = await _checked_form(ctx, request)
    spec = BY_NAME.get(rule)
    if spec is None or spec.scope != "instance":
        raise HTTPException(404, f"no per-instance rule {rule!r}")
    if get_instance(ctx.engine, instance_id) is None:
        raise HTTPException(404, f"no instance {instance_id}")
    base = effective(rule, evaluator(ctx).rule_settings, None)
    params: dict[str, Any] = {}
    reset = form.get("reset") is not None
    if not reset:
        for key, default in base.items():
            if isinstance(default, bool):
                raw: Any = "true" if form.get(key) in ("on", "true", "1") else "false"
            else:
                raw = form.get(key)
                if raw is None or str(raw).strip() == "":
                    continue
            try:
                v = coerce(rule, key, raw)
            except ParamError as exc:
                return _back(f"/alerts/rules?instance={instance_id}", f"not saved: {exc}")
            if v != default:
                params[key] = v
    store.set_override(ctx.engine, instance_id, rule, params, ctx.now())
    what = "reset to defaults" if not params else "saved: " + ", ".join(f"{k}={v}" for k, v in params.items())
    return _back(f"/alerts/rules?instance={instance_id}", f"{rule} on instance {instance_id} {what}")


@router.get("/alerts/{alert_id}", response_class=HTMLResponse)
@requires(VIEWER)
def alert_page(ctx: CtxDep, alert_id: DbId, request: Request) -> HTMLResponse:
    row = store.get_alert(ctx.engine, alert_id)
    if row is None:
        raise HTTPException(404, f"no alert {alert_id}")
    now = ctx.now()
    return _render(
        ctx,
        request,
        "alerts/detail.html",
        {
            "alert": alert_json(row, store.active_silences(ctx.engine, now), now),
            "transitions": store.list_transitions(ctx.engine, alert_id=alert_id),
            "deliveries": store.list_deliveries(ctx.engine, alert_id=alert_id),
            "simulated": bool(row.get("simulated")),
        },
    )


@router.post("/alerts/{alert_id}/ack")
@requires(OPERATOR)
async def ack(ctx: CtxDep, alert_id: DbId, request: Request) -> Response:
    form = await _checked_form(ctx, request)
    if store.get_alert(ctx.engine, alert_id) is None:
        raise HTTPException(404, f"no alert {alert_id}")
    ok = store.acknowledge(ctx.engine, alert_id, ctx.now(), str(form.get("note") or ""))
    return _back(f"/alerts/{alert_id}", "acknowledged" if ok else "was already acknowledged")


@router.post("/alerts/silences")
@requires(OPERATOR)
async def silence(ctx: CtxDep, request: Request) -> Response:
    form = await _checked_form(ctx, request)
    sid = create_silence(
        ctx,
        minutes=form.get("minutes"),
        rule=form.get("rule"),
        instance=form.get("instance"),
        host=form.get("host"),
        reason=form.get("reason"),
    )
    back = str(form.get("back") or "/alerts")
    if not back.startswith("/alerts") or back.startswith("//"):
        back = "/alerts"  # only back to our own pages (no open redirect)
    return _back(back, f"silence {sid} created")


@router.post("/alerts/silences/{silence_id}/expire")
@requires(OPERATOR)
async def expire(ctx: CtxDep, silence_id: DbId, request: Request) -> Response:
    await _checked_form(ctx, request)
    ok = store.expire_silence(ctx.engine, silence_id, ctx.now())
    return _back("/alerts", f"silence {silence_id} " + ("expired" if ok else "was not active"))


@router.post("/alerts/channels/{name}/test")
@requires(OPERATOR)
async def test_channel(ctx: CtxDep, name: str, request: Request) -> Response:
    await _checked_form(ctx, request)
    channel = next((c for c in ctx.settings.alerts.channels if c.name == name), None)
    if channel is None:
        raise HTTPException(404, f"no channel {name!r} in settings.alerts.channels")
    _did, err = await run_in_threadpool(send_test, ctx.engine, channel, ctx.now(), delivery_config(ctx))
    return _back("/alerts", f"test to {name}: " + ("sent" if err is None else f"FAILED: {err}"))
