"""Cache-sizing JSON: the curve, and "apply this size".

- ``GET /api/v1/instances/{id}/sizing`` (alias ``/cache-sizing``): viewer.
- ``POST /api/v1/instances/{id}/sizing/profile`` ``{"offload_gib": x, "request_rollout": bool}``:
  operator; saves the sized profile and, when asked, requests its rollout (the usual flow).
- ``POST /api/v1/instances/{id}/sizing/kv-events`` ``{"request_rollout": bool}``: operator; the
  current profile with KV events on.
- ``POST /api/v1/instances/{id}/sizing/ab`` ``{"offload_gib": x, "runs": 3..10}``: operator;
  "A/B current vs suggested" (app/sizing/checks.py).
- ``GET /api/v1/hosts/{id}/sizing``: viewer; the split of the host's pinned headroom across its
  instances.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.auth.roles import OPERATOR, VIEWER, requester, requires
from app.controller import rollouts
from app.sizing import checks, events
from app.sizing.service import SizingError, profile_for_size
from app.sizing.views import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    PRICE,
    host_report,
    json_object,
    model_figure,
    sizing_report,
    span,
)
from app.web.deps import MAX_RANGE_CHARS, CtxDep, DbId, RangeQueryDep

router = APIRouter()


@router.get("/api/v1/instances/{instance_id}/sizing")
@router.get("/api/v1/instances/{instance_id}/cache-sizing")
@requires(VIEWER)
def sizing_api(
    ctx: CtxDep,
    instance_id: DbId,
    rq: RangeQueryDep,
    layers: int | None = Query(None, ge=1, le=MAX_LAYERS),
    kv_heads: int | None = Query(None, ge=1, le=MAX_HEADS),
    head_dim: int | None = Query(None, ge=1, le=MAX_HEAD_DIM),
    dtype: str | None = Query(None, max_length=16),
    price: float = PRICE,
) -> JSONResponse:
    """The hit-rate-vs-tier-size curve of an instance, every lever, the host split (range: default
    15m). Role: viewer."""
    model = model_figure(layers, kv_heads, head_dim, dtype)
    return JSONResponse(sizing_report(ctx, instance_id, rq, model, price))


@router.get("/api/v1/hosts/{host_id}/sizing")
@requires(VIEWER)
def host_sizing_api(
    ctx: CtxDep,
    host_id: DbId,
    range: str | None = Query(None, max_length=MAX_RANGE_CHARS, description="a range name such as 15m (default)"),
    price: float = PRICE,
) -> JSONResponse:
    """The split of a host's pinned headroom across its instances. Role: viewer."""
    return JSONResponse(host_report(ctx, host_id, range, price))


@router.post("/api/v1/instances/{instance_id}/sizing/kv-events")
@requires(OPERATOR)
async def kv_events_api(ctx: CtxDep, instance_id: DbId, request: Request) -> JSONResponse:
    """Save the current profile with KV events on; with request_rollout, roll it out. Role: operator."""
    body = await json_object(request, '{"request_rollout": bool}')
    who = requester(request, None)

    def work() -> dict[str, Any]:
        try:
            name = events.profile_with_events(ctx, instance_id, author=who)
        except events.EventsError as exc:
            raise HTTPException(exc.status, str(exc)) from None
        out: dict[str, Any] = {"profile": name, "rollout_id": None}
        if body.get("request_rollout") is True:
            try:
                out["rollout_id"] = rollouts.request_rollout(ctx, instance_id, name, requested_by=who)
            except rollouts.RolloutError as exc:
                raise HTTPException(exc.status, str(exc)) from None
        return out

    return JSONResponse(await run_in_threadpool(work), status_code=201)


@router.post("/api/v1/instances/{instance_id}/sizing/ab")
@requires(OPERATOR)
async def sizing_ab_api(ctx: CtxDep, instance_id: DbId, request: Request) -> JSONResponse:
    """A/B the current tier size against a suggested one; keeps the check. Role: operator."""
    body = await json_object(request, '{"offload_gib": number, "runs": 3-10, "range": "15m"}')
    rng = body.get("range")
    if rng is not None and (not isinstance(rng, str) or len(rng) > MAX_RANGE_CHARS):
        raise HTTPException(400, "range must be a range name such as 15m")
    tr = span(ctx, rng)
    who = requester(request, None)
    try:
        out = await run_in_threadpool(
            lambda: checks.start_ab(
                ctx, instance_id, body.get("offload_gib"), runs=body.get("runs", 3), start=tr.start, end=tr.end, who=who
            )
        )
    except SizingError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return JSONResponse(out, status_code=201)


@router.post("/api/v1/instances/{instance_id}/sizing/profile")
@requires(OPERATOR)
async def sizing_profile_api(ctx: CtxDep, instance_id: DbId, request: Request) -> JSONResponse:
    """Save the sized profile; with request_rollout, request its rollout. Role: operator."""
    body = await json_object(request, '{"offload_gib": number}')
    who = requester(request, None)
    try:
        name = profile_for_size(ctx, instance_id, body.get("offload_gib"), author=who)
    except SizingError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    out: dict[str, Any] = {"profile": name, "rollout_id": None}
    if body.get("request_rollout") is True:
        try:
            out["rollout_id"] = rollouts.request_rollout(ctx, instance_id, name, requested_by=who)
        except rollouts.RolloutError as exc:
            raise HTTPException(exc.status, str(exc)) from None
    return JSONResponse(out, status_code=201)
