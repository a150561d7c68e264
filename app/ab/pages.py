"""The A/B pages: /experiments (list and start form), /instances/{id}/experiment (the instance
page's entry), /experiments/{id} with its progress fragment, and the cancel and keep forms."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from app.ab import service
from app.ab.actions import keep_arm, load_or_http, orchestrator, start_from
from app.ab.charts import experiment_figures
from app.ab.verdict import describe
from app.auth.roles import OPERATOR, VIEWER, requester, requires
from app.context import AppContext
from app.controller.control import watched_urls
from app.storage import ab_store as st
from app.storage import rollouts_store as rs
from app.storage.series_store import get_instance, list_instances
from app.web import csrf
from app.web.deps import CtxDep, DbId

WORKLOAD_FIELDS = {
    "prefix_tokens": int,
    "evict_prefixes": int,
    "repetitions": int,
    "max_tokens": int,
    "num_prefixes": int,
    "suffix_tokens": int,
    "requests": int,
    "concurrency": int,
    "zipf_s": float,
    "window_s": float,
    "speed": float,
    "request_timeout_s": float,
}


def _workload_from_form(form: Any) -> dict[str, Any]:
    wl: dict[str, Any] = {"kind": str(form.get("kind") or "probe")}
    for key, typ in WORKLOAD_FIELDS.items():
        raw = str(form.get(key) or "").strip()
        if raw:
            try:
                wl[key] = typ(raw)
            except ValueError:
                raise service.ExperimentError(f"{key} must be a number", 422) from None
    if form.get("distribution"):
        wl["distribution"] = str(form.get("distribution"))
    if wl["kind"] == "replay":
        trace = str(form.get("trace") or "").strip()
        if not trace:
            raise service.ExperimentError("a replay needs a trace: paste JSONL lines", 422)
        rows = []
        for n, line in enumerate(trace.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    raise service.ExperimentError(f"trace line {n} is not JSON", 422) from None
        wl["records"] = rows
    return wl


def render(ctx: AppContext, request: Request, name: str, data: dict[str, Any], status: int = 200) -> Response:
    return csrf.render_page(
        ctx,
        request,
        name,
        data,
        active_nav="experiments",
        status=status,
        template_globals={"ab_describe": describe},
    )


def list_page(
    ctx: AppContext, request: Request, form: dict[str, Any], error: str | None, status: int = 200
) -> Response:
    instances = list_instances(ctx.engine)
    profiles = [p["name"] for p in rs.list_profiles(ctx.engine)]
    items = [service.experiment_view(e) for e in st.list_experiments(ctx.engine, limit=200)]
    return render(
        ctx,
        request,
        "ab/list.html",
        {
            "experiments": items,
            "instances": instances,
            "profiles": profiles,
            "form": form,
            "error": error,
            "simulated": any(i.get("simulated") for i in instances),
            "watched": watched_urls(ctx, instances),
        },
        status,
    )


def detail_data(ctx: AppContext, experiment_id: int) -> dict[str, Any]:
    exp, runs = load_or_http(ctx, experiment_id)
    view = service.experiment_view(exp, runs)
    kind = str(view["workload"].get("kind", "probe"))
    figs = experiment_figures(kind, runs) if any(r["state"] == "done" for r in runs) else []
    return {"exp": view, "figures": figs, "simulated": view["simulated"]}


router = APIRouter(include_in_schema=False)


@router.get("/experiments", response_class=HTMLResponse)
@requires(VIEWER)
def experiments_page(ctx: CtxDep, request: Request) -> Response:
    return list_page(ctx, request, {}, None)


@router.get("/instances/{instance_id}/experiment", response_class=HTMLResponse)
@requires(VIEWER)
def new_for_instance(ctx: CtxDep, instance_id: DbId, request: Request) -> Response:
    """The instance page's "A/B test" entry: instance chosen, A = its current profile."""
    if get_instance(ctx.engine, instance_id) is None:
        raise HTTPException(404, f"no instance {instance_id}")
    current = rs.instance_profiles(ctx.engine, instance_id)["current"]
    return list_page(ctx, request, {"instance": instance_id, "a": current["name"] if current else ""}, None)


@router.post("/experiments")
@requires(OPERATOR)
async def experiments_create(ctx: CtxDep, request: Request) -> Response:
    form = await request.form()
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    data = {k: str(v) for k, v in form.items() if k != csrf.FIELD}
    try:
        body = {
            "instance": data.get("instance"),
            "a": data.get("a") or None,
            "b": data.get("b"),
            "runs": data.get("runs") or 3,
            "seed": data.get("seed") or 0,
            "override_hybrid": data.get("override_hybrid") == "on",
            "workload": _workload_from_form(form),
            "executor": data.get("executor") or "auto",
        }
        eid = await run_in_threadpool(start_from, ctx, body, requester(request, None))
    except service.ExperimentError as exc:
        return list_page(ctx, request, data, str(exc), exc.status)
    except HTTPException as exc:
        return list_page(ctx, request, data, str(exc.detail), exc.status_code)
    return RedirectResponse(f"/experiments/{eid}", status_code=303)


@router.get("/experiments/{experiment_id}", response_class=HTMLResponse)
@requires(VIEWER)
def experiment_page(ctx: CtxDep, experiment_id: DbId, request: Request) -> Response:
    return render(ctx, request, "ab/detail.html", detail_data(ctx, experiment_id))


@router.get("/experiments/{experiment_id}/progress", response_class=HTMLResponse)
@requires(VIEWER)
def experiment_progress(ctx: CtxDep, experiment_id: DbId, request: Request) -> Response:
    data = detail_data(ctx, experiment_id)
    resp = render(ctx, request, "ab/_progress.html", data)
    if data["exp"]["finished"]:
        resp.headers["HX-Refresh"] = "true"  # reload once for the result charts
    return resp


@router.post("/experiments/{experiment_id}/cancel")
@requires(OPERATOR)
async def cancel_form(ctx: CtxDep, experiment_id: DbId, request: Request) -> Response:
    form = await request.form()
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    orchestrator(ctx).cancel(experiment_id, ctx.now(), by="web")
    return RedirectResponse(f"/experiments/{experiment_id}", status_code=303)


@router.post("/experiments/{experiment_id}/keep")
@requires(OPERATOR)
async def keep_form(ctx: CtxDep, experiment_id: DbId, request: Request) -> Response:
    form = await request.form()
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    rid = await run_in_threadpool(keep_arm, ctx, experiment_id, str(form.get("arm") or ""), requester(request, None))
    return RedirectResponse(f"/rollouts/{rid}", status_code=303)
