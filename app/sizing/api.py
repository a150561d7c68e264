"""Cache-sizing JSON: the curve, and "apply this size".

- ``GET /api/v1/instances/{id}/sizing`` (alias ``/cache-sizing``): viewer.
- ``POST /api/v1/instances/{id}/sizing/profile`` ``{"offload_gib": x, "request_rollout": bool}``:
  operator; saves the sized profile and, when asked, requests its rollout (the usual flow).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from app.auth.roles import OPERATOR, VIEWER, requester, requires
from app.controller import rollouts
from app.sizing.service import SizingError, profile_for_size
from app.sizing.views import MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, model_figure, sizing_report
from app.web import csrf
from app.web.deps import CtxDep, DbId, RangeQueryDep
from app.web.json_body import read_json

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
) -> JSONResponse:
    """The hit-rate-vs-tier-size curve of an instance (range: default 15m). Role: viewer."""
    model = model_figure(layers, kv_heads, head_dim, dtype)
    return JSONResponse(sizing_report(ctx, instance_id, rq, model))


@router.post("/api/v1/instances/{instance_id}/sizing/profile")
@requires(OPERATOR)
async def sizing_profile_api(ctx: CtxDep, instance_id: DbId, request: Request) -> JSONResponse:
    """Save the sized profile; with request_rollout, request its rollout. Role: operator."""
    csrf.require_json(request)
    body = await read_json(request, 'body must be JSON: {"offload_gib": number}')
    if not isinstance(body, dict):
        raise HTTPException(400, 'body must be a JSON object: {"offload_gib": number}')
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
