"""Cache-sizing routes: the JSON curve, the page and its fragment, "apply this size".

- ``GET /api/v1/instances/{id}/sizing`` (alias ``/cache-sizing``): viewer.
- ``POST /api/v1/instances/{id}/sizing/profile`` ``{"offload_gib": x, "request_rollout": bool}``:
  operator; saves the sized profile and, when asked, requests its rollout (the usual flow).
- ``GET /instances/{id}/sizing`` (page) and ``/instances/{id}/sizing/curve`` (fragment): viewer.
- ``POST /instances/{id}/sizing/profile`` (form): operator; saves the profile and opens the
  apply page on it, where the argv diff and preflight are reviewed before the restart.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from app.auth.roles import OPERATOR, VIEWER, requester, requires
from app.context import AppContext
from app.controller import rollouts
from app.dashboard.ranges import RANGES, resolve
from app.sizing.chart import curve_svg
from app.sizing.curve import Figure, model_bytes_per_token
from app.sizing.service import SizingError, profile_for_size, report
from app.web import csrf
from app.web.ids import DbId
from app.web.json_body import read_json

MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096


def _model_figure(layers: int | None, kv_heads: int | None, head_dim: int | None, dtype: str | None) -> Figure | None:
    given = [v is not None for v in (layers, kv_heads, head_dim, dtype)]
    if not any(given):
        return None
    if not all(given):
        raise HTTPException(400, "give all of layers, kv_heads, head_dim and dtype, or none")
    assert layers is not None and kv_heads is not None and head_dim is not None and dtype is not None
    try:
        return model_bytes_per_token(layers, kv_heads, head_dim, dtype)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def _report(
    ctx: AppContext, instance_id: int, range_: str | None, start: float | None, end: float | None, model: Figure | None
) -> dict[str, Any]:
    tr = resolve(ctx.now(), range_ or ("15m" if start is None and end is None else None), start, end)
    try:
        out = report(ctx, instance_id, tr.start, tr.end, model_bpt=model)
    except SizingError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    out["range"] = tr.name
    return out


def router(ctx: AppContext) -> APIRouter:
    r = APIRouter()

    @r.get("/api/v1/instances/{instance_id}/sizing")
    @r.get("/api/v1/instances/{instance_id}/cache-sizing")
    @requires(VIEWER)
    async def sizing_api(
        instance_id: DbId,
        range: str | None = Query(None, max_length=16, description=f"one of {', '.join(RANGES)} (default 15m)"),
        start: float | None = None,
        end: float | None = None,
        layers: int | None = Query(None, ge=1, le=MAX_LAYERS),
        kv_heads: int | None = Query(None, ge=1, le=MAX_HEADS),
        head_dim: int | None = Query(None, ge=1, le=MAX_HEAD_DIM),
        dtype: str | None = Query(None, max_length=16),
    ) -> JSONResponse:
        """The hit-rate-vs-tier-size curve of an instance. Role: viewer."""
        model = _model_figure(layers, kv_heads, head_dim, dtype)
        return JSONResponse(await run_in_threadpool(_report, ctx, instance_id, range, start, end, model))

    @r.post("/api/v1/instances/{instance_id}/sizing/profile")
    @requires(OPERATOR)
    async def sizing_profile_api(instance_id: DbId, request: Request) -> JSONResponse:
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

    return r


def page_router(ctx: AppContext) -> APIRouter:
    r = APIRouter(include_in_schema=False)

    def render(request: Request, name: str, data: dict[str, Any], status: int = 200) -> Response:
        return csrf.render_page(ctx, request, name, data, active_nav="overview", status=status)

    def view(
        instance_id: int, range_: str | None, start: float | None, end: float | None, model: Figure | None = None
    ) -> dict[str, Any]:
        rep = _report(ctx, instance_id, range_, start, end, model)
        return {"rep": rep, "svg": curve_svg(rep), "ranges": list(RANGES), "simulated": rep["simulated"]}

    @r.get("/instances/{instance_id}/sizing", response_class=HTMLResponse)
    @requires(VIEWER)
    def sizing_page(
        instance_id: DbId,
        request: Request,
        range: str | None = Query(None, max_length=16),
        start: float | None = None,
        end: float | None = None,
        layers: int | None = Query(None, ge=1, le=MAX_LAYERS),
        kv_heads: int | None = Query(None, ge=1, le=MAX_HEADS),
        head_dim: int | None = Query(None, ge=1, le=MAX_HEAD_DIM),
        dtype: str | None = Query(None, max_length=16),
    ) -> Response:
        """How big should the offload tier be? Role: viewer. The model's figures (as the API takes
        them) give GiB where vLLM's own do not, e.g. with --num-gpu-blocks-override."""
        model = _model_figure(layers, kv_heads, head_dim, dtype)
        return render(request, "sizing/page.html", view(instance_id, range, start, end, model))

    @r.get("/instances/{instance_id}/sizing/curve", response_class=HTMLResponse)
    @requires(VIEWER)
    def sizing_fragment(
        instance_id: DbId,
        request: Request,
        range: str | None = Query(None, max_length=16),
        start: float | None = None,
        end: float | None = None,
        layers: int | None = Query(None, ge=1, le=MAX_LAYERS),
        kv_heads: int | None = Query(None, ge=1, le=MAX_HEADS),
        head_dim: int | None = Query(None, ge=1, le=MAX_HEAD_DIM),
        dtype: str | None = Query(None, max_length=16),
    ) -> Response:
        """The curve fragment (htmx refresh). Role: viewer."""
        model = _model_figure(layers, kv_heads, head_dim, dtype)
        return render(request, "sizing/_curve.html", view(instance_id, range, start, end, model))

    @r.post("/instances/{instance_id}/sizing/profile")
    @requires(OPERATOR)
    async def sizing_profile_form(instance_id: DbId, request: Request) -> Response:
        """Save the sized profile, then review it on the apply page. Role: operator."""
        form = await request.form()
        csrf.check(request, form.get(csrf.FIELD), ctx.secret)
        try:
            name = profile_for_size(ctx, instance_id, form.get("offload_gib"), author=requester(request, None))
        except SizingError as exc:
            raise HTTPException(exc.status, str(exc)) from None
        return RedirectResponse(f"/instances/{instance_id}/apply?profile={name}", status_code=303)

    return r
