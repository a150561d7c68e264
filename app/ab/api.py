"""A/B experiments: JSON API under /api/v1/experiments, pages under /experiments, the tick job.

The workload runs app-side: a worker thread of this process sends the requests to the instance
URL (the address the agent scrapes), so the app must reach vLLM. Profile switches go through the
controller's normal rollouts (the agent restarts vLLM, with its preflight and rollback).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from app.ab import service
from app.ab.agent_executor import AgentExecutor
from app.ab.charts import experiment_figures
from app.ab.orchestrator import Limits, Orchestrator
from app.ab.ports import RolloutsPort, ThreadExecutor
from app.ab.verdict import describe
from app.auth.roles import requester
from app.context import AppContext
from app.controller.control import watched_urls
from app.storage import ab_store as st
from app.storage.ab_rows import ExperimentRow, RunRow
from app.storage.controller_rows import NamedVersionRow, ProfileRow
from app.storage.series_store import get_instance, list_instances
from app.web import csrf
from app.web.ids import DbId, OptionalDbIdQuery
from app.web.jobs import register_job
from app.web.json_body import read_json

TICK_JOB = "ab_tick"
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


def build_orchestrator(ctx: AppContext) -> Orchestrator:
    s = ctx.settings
    limits = Limits(
        switch_timeout_s=s.ab_switch_timeout_s,
        run_timeout_s=s.ab_run_timeout_s,
        max_error_rate=s.ab_max_error_rate,
        n_boot=s.ab_bootstrap_resamples,
        max_foreign_share=s.ab_max_foreign_share,
    )
    return Orchestrator(
        ctx.engine,
        RolloutsPort(ctx),
        ThreadExecutor(max_workers=s.ab_workers),
        limits,
        agent_executor=AgentExecutor(ctx.engine),
    )


def orchestrator(ctx: AppContext) -> Orchestrator:
    orch = ctx.peek_state(Orchestrator)
    if orch is None:
        orch = build_orchestrator(ctx)
        ctx.set_state(orch)
    return orch


def tick_job(ctx: AppContext, now: float) -> None:
    orchestrator(ctx).tick(now)


def install(app: FastAPI, ctx: AppContext) -> None:
    orch = orchestrator(ctx)
    register_job(ctx, TICK_JOB, tick_job, ctx.settings.ab_tick_interval_s)
    if isinstance(orch.agent_executor, AgentExecutor):  # workloads run by the instance's agent
        ctx.command_providers.append(orch.agent_executor.commands_for)
        ctx.push_hooks.append(orch.agent_executor.on_push)
    previous = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        try:
            async with previous(a):
                yield
        finally:  # a workload still running stops at its next request (the run is then lost, and
            # the experiment fails and restores its instance on the next start's first tick)
            executor = orch.executor
            if isinstance(executor, ThreadExecutor):
                executor.shutdown()

    app.router.lifespan_context = lifespan
    templates = ctx.templates
    if templates is not None:
        templates.env.globals["ab_describe"] = describe
        templates.env.globals["ab_arm_tier"] = lambda version_id, name=None: arm_tier(ctx, version_id, name)
    app.include_router(api_router(ctx))
    app.include_router(page_router(ctx))


def arm_tier(ctx: AppContext, version_id: Any, name: Any = None) -> str:
    """The KV tier of an arm's profile version, in words (e.g. 'disk tier /var/kv (ExampleConnector)');
    before the experiment pins a version, the profile's current one."""
    from app.controller.profiles import policy_limits
    from app.controller.rollouts import version_profile
    from app.storage.rollouts_store import get_profile, get_version

    version: NamedVersionRow | ProfileRow | None
    try:
        version = get_version(ctx.engine, int(version_id)) if version_id is not None else None
    except (TypeError, ValueError, OverflowError):
        version = None
    if version is None and name:
        version = get_profile(ctx.engine, str(name))
    prof = version_profile(version, ctx.settings.allow_flags, policy_limits(ctx.settings))
    return prof.tier_label() if prof is not None else "unknown (profile not found or no longer valid)"


def _load(ctx: AppContext, experiment_id: int) -> tuple[ExperimentRow, list[RunRow]]:
    """The experiment and its runs, or the HTTP error that says why not."""
    try:
        return service.load(ctx, experiment_id)
    except service.ExperimentError as exc:
        raise _http(exc) from None


def _http(exc: service.ExperimentError) -> HTTPException:
    return HTTPException(exc.status, str(exc))


def _int(v: Any, what: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise HTTPException(422, f"{what} must be a whole number") from None


def _start_from(ctx: AppContext, body: dict[str, Any], who: str) -> int:
    try:
        return service.start_experiment(
            ctx,
            instance_id=_int(body.get("instance"), "instance"),
            profile_b=str(body.get("b") or ""),
            profile_a=str(body.get("a") or "") or None,
            workload=body.get("workload") or {"kind": "probe"},
            runs_per_arm=_int(body.get("runs", 3), "runs"),
            seed=_int(body.get("seed", 0), "seed"),
            override_hybrid=bool(body.get("override_hybrid")),
            requested_by=who,
            executor=str(body.get("executor") or "auto"),
            max_foreign_share=ctx.settings.ab_max_foreign_share,
        )
    except service.ExperimentError as exc:
        raise _http(exc) from None


def _keep(ctx: AppContext, experiment_id: int, arm: str, who: str) -> int:
    from app.controller.rollouts import RolloutError, request_rollout

    exp = st.get_experiment(ctx.engine, experiment_id)
    if exp is None:
        raise HTTPException(404, f"no experiment {experiment_id}")
    if exp["finished_at"] is None:
        raise HTTPException(409, "the experiment is still running; wait for it to finish (or cancel it)")
    if arm not in ("A", "B"):
        raise HTTPException(422, "arm must be A or B")
    name = str(exp["profile_a"] if arm == "A" else exp["profile_b"])
    try:
        return request_rollout(
            ctx,
            int(exp["instance_id"]),
            name,
            requested_by=f"{who} (keep {arm} of A/B #{experiment_id})",
            override_hybrid=bool((exp.get("options") or {}).get("override_hybrid")) and arm == "B",
        )
    except RolloutError as exc:
        raise HTTPException(exc.status, str(exc)) from None


# ---------------------------------------------------------------- JSON API
def api_router(ctx: AppContext) -> APIRouter:
    r = APIRouter(prefix="/api/v1")

    @r.post("/experiments")
    async def create(request: Request) -> JSONResponse:
        csrf.require_json(request)
        body = await read_json(request)
        if not isinstance(body, dict):
            raise HTTPException(422, "body must be a JSON object")
        eid = await run_in_threadpool(_start_from, ctx, body, requester(request, body.get("requested_by")))
        exp, runs = service.load(ctx, eid)
        return JSONResponse(service.experiment_view(exp, runs), status_code=201)

    @r.get("/experiments")
    def list_(instance: OptionalDbIdQuery = None, limit: int = Query(100, ge=1, le=1000)) -> JSONResponse:
        items = st.list_experiments(ctx.engine, instance_id=instance, limit=limit)
        return JSONResponse({"experiments": [service.experiment_view(e) for e in items]})

    @r.get("/experiments/{experiment_id}")
    def get(experiment_id: DbId, records: bool = False) -> JSONResponse:
        exp, runs = _load(ctx, experiment_id)
        return JSONResponse(
            json.loads(json.dumps(service.experiment_view(exp, runs, with_records=records), default=str))
        )

    @r.get("/experiments/{experiment_id}/export.json")
    def export_json(experiment_id: DbId) -> Response:
        exp, runs = _load(ctx, experiment_id)
        return Response(
            service.export_json(exp, runs),
            media_type="application/json",
            headers={"Content-Disposition": f'attachment; filename="kvscope-ab-{experiment_id}.json"'},
        )

    @r.get("/experiments/{experiment_id}/export.csv")
    def export_csv(experiment_id: DbId) -> Response:
        exp, runs = _load(ctx, experiment_id)
        return Response(
            service.export_csv(exp, runs),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="kvscope-ab-{experiment_id}.csv"'},
        )

    @r.post("/experiments/{experiment_id}/cancel")
    def cancel(experiment_id: DbId, request: Request) -> JSONResponse:
        csrf.require_json(request)
        if not orchestrator(ctx).cancel(experiment_id, ctx.now(), by="api"):
            raise HTTPException(409, f"experiment {experiment_id} is not running (finished, or unknown)")
        exp, runs = service.load(ctx, experiment_id)
        return JSONResponse(service.experiment_view(exp, runs))

    @r.post("/experiments/{experiment_id}/keep")
    async def keep(experiment_id: DbId, request: Request) -> JSONResponse:
        csrf.require_json(request)
        body = await read_json(request)
        arm = str((body or {}).get("arm", "")) if isinstance(body, dict) else ""
        rid = await run_in_threadpool(_keep, ctx, experiment_id, arm, requester(request, None))
        return JSONResponse({"rollout_id": rid, "rollout": f"/api/v1/rollouts/{rid}"}, status_code=201)

    return r


# ---------------------------------------------------------------- pages
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


def page_router(ctx: AppContext) -> APIRouter:
    r = APIRouter(include_in_schema=False)

    def render(request: Request, name: str, data: dict[str, Any], status: int = 200) -> Response:
        return csrf.render_page(
            ctx,
            request,
            name,
            data,
            active_nav="experiments",
            status=status,
            template_globals={"ab_describe": describe},
        )

    def list_page(request: Request, form: dict[str, Any], error: str | None, status: int = 200) -> Response:
        from app.storage import rollouts_store as rs

        instances = list_instances(ctx.engine)
        profiles = [p["name"] for p in rs.list_profiles(ctx.engine)]
        items = [service.experiment_view(e) for e in st.list_experiments(ctx.engine, limit=200)]
        return render(
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

    @r.get("/experiments", response_class=HTMLResponse)
    def experiments_page(request: Request) -> Response:
        return list_page(request, {}, None)

    @r.get("/instances/{instance_id}/experiment", response_class=HTMLResponse)
    def new_for_instance(instance_id: DbId, request: Request) -> Response:
        """The instance page's "A/B test" entry: instance chosen, A = its current profile."""
        from app.storage import rollouts_store as rs

        if get_instance(ctx.engine, instance_id) is None:
            raise HTTPException(404, f"no instance {instance_id}")
        current = rs.instance_profiles(ctx.engine, instance_id)["current"]
        return list_page(request, {"instance": instance_id, "a": current["name"] if current else ""}, None)

    @r.post("/experiments")
    async def experiments_create(request: Request) -> Response:
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
            eid = await run_in_threadpool(_start_from, ctx, body, requester(request, None))
        except service.ExperimentError as exc:
            return list_page(request, data, str(exc), exc.status)
        except HTTPException as exc:
            return list_page(request, data, str(exc.detail), exc.status_code)
        return RedirectResponse(f"/experiments/{eid}", status_code=303)

    def detail_data(experiment_id: int) -> dict[str, Any]:
        exp, runs = _load(ctx, experiment_id)
        view = service.experiment_view(exp, runs)
        kind = str(view["workload"].get("kind", "probe"))
        figs = experiment_figures(kind, runs) if any(r["state"] == "done" for r in runs) else []
        return {"exp": view, "figures": figs, "simulated": view["simulated"]}

    @r.get("/experiments/{experiment_id}", response_class=HTMLResponse)
    def experiment_page(experiment_id: DbId, request: Request) -> Response:
        return render(request, "ab/detail.html", detail_data(experiment_id))

    @r.get("/experiments/{experiment_id}/progress", response_class=HTMLResponse)
    def experiment_progress(experiment_id: DbId, request: Request) -> Response:
        data = detail_data(experiment_id)
        resp = render(request, "ab/_progress.html", data)
        if data["exp"]["finished"]:
            resp.headers["HX-Refresh"] = "true"  # reload once for the result charts
        return resp

    @r.post("/experiments/{experiment_id}/cancel")
    async def cancel_form(experiment_id: DbId, request: Request) -> Response:
        form = await request.form()
        csrf.check(request, form.get(csrf.FIELD), ctx.secret)
        orchestrator(ctx).cancel(experiment_id, ctx.now(), by="web")
        return RedirectResponse(f"/experiments/{experiment_id}", status_code=303)

    @r.post("/experiments/{experiment_id}/keep")
    async def keep_form(experiment_id: DbId, request: Request) -> Response:
        form = await request.form()
        csrf.check(request, form.get(csrf.FIELD), ctx.secret)
        rid = await run_in_threadpool(_keep, ctx, experiment_id, str(form.get("arm") or ""), requester(request, None))
        return RedirectResponse(f"/rollouts/{rid}", status_code=303)

    return r
