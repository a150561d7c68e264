"""The controller's JSON API under /api/v1: profiles, previews and rollouts; and its part's
install (command provider, push hook, expiry job, the routers of this module and pages.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.auth.roles import OPERATOR, VIEWER, requester, requires
from app.context import AppContext
from app.controller import pages, rollouts
from app.controller.views import (
    policy,
    profile_view,
    request_rollout,
    rollout_and_instance,
    rollout_view,
    save_profile,
    stored_rollout,
)
from app.storage import rollouts_store as rs
from app.storage.controller_rows import NamedVersionRow
from app.storage.series_store import get_instance
from app.web import csrf
from app.web.deps import MAX_DB_ID, CtxDep, DbId, OptionalDbIdQuery
from app.web.jobs import register_job
from app.web.json_body import read_json


def install(app: FastAPI, ctx: AppContext) -> None:
    ctx.command_providers.append(rollouts.command_provider(ctx))
    ctx.push_hooks.append(rollouts.push_hook(ctx))
    register_job(ctx, rollouts.EXPIRE_JOB, rollouts.expire_job, 60.0)
    app.include_router(router)
    app.include_router(pages.router)


def _spec_from_json(body: Any) -> tuple[str, dict[str, Any], str]:
    if not isinstance(body, dict):
        raise HTTPException(422, "body must be a JSON object")
    name = str(body.get("name") or "")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        spec = {k: v for k, v in body.items() if k not in ("name", "note", "author")}
    return name, spec, str(body.get("note") or "")


async def _json(request: Request) -> Any:
    csrf.require_json(request)
    return await read_json(request)


router = APIRouter(prefix="/api/v1")


@router.get("/profiles")
@requires(VIEWER)
def profiles(ctx: CtxDep) -> JSONResponse:
    out = [profile_view({**p, "versions": []}, *policy(ctx)) for p in rs.list_profiles(ctx.engine)]
    return JSONResponse({"profiles": out})


@router.post("/profiles")
@requires(OPERATOR)
async def create(ctx: CtxDep, request: Request) -> JSONResponse:
    name, spec, note = _spec_from_json(await _json(request))
    return save_profile(ctx, name, spec, note, create=True)


@router.get("/profiles/{name}")
@requires(VIEWER)
def show(ctx: CtxDep, name: str) -> JSONResponse:
    p = rs.get_profile(ctx.engine, name)
    if p is None:
        raise HTTPException(404, f"no profile named {name!r}")
    return JSONResponse(profile_view(p, *policy(ctx)))


@router.put("/profiles/{name}")
@requires(OPERATOR)
async def edit(ctx: CtxDep, name: str, request: Request) -> JSONResponse:
    _n, spec, note = _spec_from_json(await _json(request))
    return save_profile(ctx, name, spec, note, create=False)


def _brief(v: NamedVersionRow | None) -> dict[str, Any] | None:
    return {"name": v["name"], "version": v["version"], "spec": v["spec"]} if v else None


@router.get("/instances/{instance_id}/profile")
@requires(VIEWER)
def instance_profile(ctx: CtxDep, instance_id: DbId) -> JSONResponse:
    if get_instance(ctx.engine, instance_id) is None:
        raise HTTPException(404, f"no instance {instance_id}")
    ip = rs.instance_profiles(ctx.engine, instance_id)
    return JSONResponse({"current": _brief(ip["current"]), "lkg": _brief(ip["lkg"])})


@router.post("/instances/{instance_id}/preview")
@requires(OPERATOR)
async def preview(ctx: CtxDep, instance_id: DbId, request: Request) -> JSONResponse:
    body = await _json(request)
    if not isinstance(body, dict) or not body.get("profile"):
        raise HTTPException(422, 'give {"profile": NAME}')
    try:
        out = await run_in_threadpool(
            rollouts.preview,
            ctx,
            instance_id,
            str(body["profile"]),
            override_hybrid=bool(body.get("override_hybrid")),
        )
    except rollouts.RolloutError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return JSONResponse(out)


@router.post("/rollouts")
@requires(OPERATOR)
async def create_rollout(ctx: CtxDep, request: Request) -> JSONResponse:
    body = await _json(request)
    if not isinstance(body, dict):
        raise HTTPException(422, "body must be a JSON object")
    raw = body.get("instance")
    try:
        instance_id = int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise HTTPException(422, "instance must be an instance id (see /api/v1/instances)") from None
    if isinstance(raw, bool) or not 1 <= instance_id <= MAX_DB_ID:
        raise HTTPException(422, f"instance must be an instance id from 1 to {MAX_DB_ID} (see /api/v1/instances)")
    rid = request_rollout(
        ctx,
        instance_id,
        str(body.get("profile") or ""),
        bool(body.get("override_hybrid")),
        requester(request, body.get("requested_by")),
        body.get("probe"),
    )
    return JSONResponse(rollout_view(stored_rollout(ctx, rid)), status_code=201)


@router.get("/rollouts")
@requires(VIEWER)
def list_(ctx: CtxDep, instance: OptionalDbIdQuery = None, limit: int = Query(100, ge=1, le=1000)) -> JSONResponse:
    return JSONResponse(
        {"rollouts": [rollout_view(x) for x in rs.list_rollouts(ctx.engine, instance_id=instance, limit=limit)]}
    )


@router.get("/rollouts/{rollout_id}")
@requires(VIEWER)
def get(ctx: CtxDep, rollout_id: DbId) -> JSONResponse:
    return JSONResponse(rollout_view(*rollout_and_instance(ctx, rollout_id)))


@router.post("/rollouts/{rollout_id}/cancel")
@requires(OPERATOR)
def cancel(ctx: CtxDep, rollout_id: DbId, request: Request) -> JSONResponse:
    csrf.require_json(request)
    if not rs.finish_rollout(
        ctx.engine,
        rollout_id,
        "cancelled",
        "cancelled before an agent picked it up",
        ctx.now(),
        only_from=("requested",),
    ):
        raise HTTPException(409, "only a rollout still 'requested' can be cancelled (the agent owns it now)")
    return JSONResponse(rollout_view(stored_rollout(ctx, rollout_id)))
