"""A/B experiments: the JSON API under /api/v1/experiments, and the part's install (the tick
job, the agent executor's hooks, the template globals, the routers of this module and pages.py).

The workload runs app-side: a worker thread of this process sends the requests to the instance
URL (the address the agent scrapes), so the app must reach vLLM. Profile switches go through the
controller's normal rollouts (the agent restarts vLLM, with its preflight and rollback).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from app.ab import pages, service
from app.ab.actions import arm_tier, keep_arm, load_or_http, orchestrator, start_from, tick_job
from app.ab.agent_executor import AgentExecutor
from app.ab.ports import ThreadExecutor
from app.ab.verdict import describe
from app.auth.roles import OPERATOR, VIEWER, requester, requires
from app.context import AppContext
from app.storage import ab_store as st
from app.web import csrf
from app.web.deps import CtxDep, DbId, OptionalDbIdQuery
from app.web.jobs import register_job
from app.web.json_body import read_json

__all__ = ["TICK_JOB", "install", "router", "tick_job"]

TICK_JOB = "ab_tick"
# Running experiments move on every second: a run's end is noticed within a tick, and a tick
# that finds nothing to do costs one small query
TICK_INTERVAL_S = 1.0


def install(app: FastAPI, ctx: AppContext) -> None:
    orch = orchestrator(ctx)
    register_job(ctx, TICK_JOB, tick_job, TICK_INTERVAL_S)
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
    app.include_router(router)
    app.include_router(pages.router)


router = APIRouter(prefix="/api/v1")


@router.post("/experiments")
@requires(OPERATOR)
async def create(ctx: CtxDep, request: Request) -> JSONResponse:
    csrf.require_json(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise HTTPException(422, "body must be a JSON object")
    eid = await run_in_threadpool(start_from, ctx, body, requester(request, body.get("requested_by")))
    exp, runs = service.load(ctx, eid)
    return JSONResponse(service.experiment_view(exp, runs), status_code=201)


@router.get("/experiments")
@requires(VIEWER)
def list_(ctx: CtxDep, instance: OptionalDbIdQuery = None, limit: int = Query(100, ge=1, le=1000)) -> JSONResponse:
    items = st.list_experiments(ctx.engine, instance_id=instance, limit=limit)
    return JSONResponse({"experiments": [service.experiment_view(e) for e in items]})


@router.get("/experiments/{experiment_id}")
@requires(VIEWER)
def get(ctx: CtxDep, experiment_id: DbId, records: bool = False) -> JSONResponse:
    exp, runs = load_or_http(ctx, experiment_id)
    return JSONResponse(json.loads(json.dumps(service.experiment_view(exp, runs, with_records=records), default=str)))


@router.get("/experiments/{experiment_id}/export.json")
@requires(VIEWER)
def export_json(ctx: CtxDep, experiment_id: DbId) -> Response:
    exp, runs = load_or_http(ctx, experiment_id)
    return Response(
        service.export_json(exp, runs),
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="kvscope-ab-{experiment_id}.json"'},
    )


@router.get("/experiments/{experiment_id}/export.csv")
@requires(VIEWER)
def export_csv(ctx: CtxDep, experiment_id: DbId) -> Response:
    exp, runs = load_or_http(ctx, experiment_id)
    return Response(
        service.export_csv(exp, runs),
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="kvscope-ab-{experiment_id}.csv"'},
    )


@router.post("/experiments/{experiment_id}/cancel")
@requires(OPERATOR)
def cancel(ctx: CtxDep, experiment_id: DbId, request: Request) -> JSONResponse:
    csrf.require_json(request)
    if not orchestrator(ctx).cancel(experiment_id, ctx.now(), by="api"):
        raise HTTPException(409, f"experiment {experiment_id} is not running (finished, or unknown)")
    exp, runs = service.load(ctx, experiment_id)
    return JSONResponse(service.experiment_view(exp, runs))


@router.post("/experiments/{experiment_id}/keep")
@requires(OPERATOR)
async def keep(ctx: CtxDep, experiment_id: DbId, request: Request) -> JSONResponse:
    csrf.require_json(request)
    body = await read_json(request)
    arm = str((body or {}).get("arm", "")) if isinstance(body, dict) else ""
    rid = await run_in_threadpool(keep_arm, ctx, experiment_id, arm, requester(request, None))
    return JSONResponse({"rollout_id": rid, "rollout": f"/api/v1/rollouts/{rid}"}, status_code=201)
