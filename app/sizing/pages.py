"""Cache-sizing pages: the page and its curve fragment, and the "apply this size" form.

- ``GET /instances/{id}/sizing`` (page) and ``/instances/{id}/sizing/curve`` (fragment): viewer.
- ``POST /instances/{id}/sizing/profile`` (form): operator; saves the profile and opens the
  apply page on it, where the argv diff and preflight are reviewed before the restart.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.auth.roles import OPERATOR, VIEWER, requester, requires
from app.context import AppContext
from app.controller.control import watched_urls
from app.sizing.chart import curve_svg
from app.sizing.curve import Figure
from app.sizing.service import SizingError, profile_for_size
from app.sizing.views import MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, model_figure, sizing_report
from app.storage.series_store import get_instance
from app.web import csrf
from app.web.deps import CtxDep, DbId, RangeQuery, RangeQueryDep
from app.web.ranges import RANGES


def _page(
    ctx: AppContext, request: Request, name: str, instance_id: int, rq: RangeQuery, model: Figure | None = None
) -> Response:
    rep = sizing_report(ctx, instance_id, rq, model)
    inst = get_instance(ctx.engine, instance_id)
    data: dict[str, Any] = {
        "rep": rep,
        "svg": curve_svg(rep),
        "ranges": list(RANGES),
        "simulated": rep["simulated"],
        "watched": watched_urls(ctx, [inst] if inst is not None else []),
    }
    return csrf.render_page(ctx, request, name, data, active_nav="overview")


router = APIRouter(include_in_schema=False)


@router.get("/instances/{instance_id}/sizing", response_class=HTMLResponse)
@requires(VIEWER)
def sizing_page(
    ctx: CtxDep,
    instance_id: DbId,
    request: Request,
    rq: RangeQueryDep,
    layers: int | None = Query(None, ge=1, le=MAX_LAYERS),
    kv_heads: int | None = Query(None, ge=1, le=MAX_HEADS),
    head_dim: int | None = Query(None, ge=1, le=MAX_HEAD_DIM),
    dtype: str | None = Query(None, max_length=16),
) -> Response:
    """How big should the offload tier be? Role: viewer. The model's figures (as the API takes
    them) give GiB where vLLM's own do not, e.g. with --num-gpu-blocks-override."""
    model = model_figure(layers, kv_heads, head_dim, dtype)
    return _page(ctx, request, "sizing/page.html", instance_id, rq, model)


@router.get("/instances/{instance_id}/sizing/curve", response_class=HTMLResponse)
@requires(VIEWER)
def sizing_fragment(
    ctx: CtxDep,
    instance_id: DbId,
    request: Request,
    rq: RangeQueryDep,
    layers: int | None = Query(None, ge=1, le=MAX_LAYERS),
    kv_heads: int | None = Query(None, ge=1, le=MAX_HEADS),
    head_dim: int | None = Query(None, ge=1, le=MAX_HEAD_DIM),
    dtype: str | None = Query(None, max_length=16),
) -> Response:
    """The curve fragment (htmx refresh). Role: viewer."""
    model = model_figure(layers, kv_heads, head_dim, dtype)
    return _page(ctx, request, "sizing/_curve.html", instance_id, rq, model)


@router.post("/instances/{instance_id}/sizing/profile")
@requires(OPERATOR)
async def sizing_profile_form(ctx: CtxDep, instance_id: DbId, request: Request) -> Response:
    """Save the sized profile, then review it on the apply page. Role: operator."""
    form = await request.form()
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    try:
        name = profile_for_size(ctx, instance_id, form.get("offload_gib"), author=requester(request, None))
    except SizingError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return RedirectResponse(f"/instances/{instance_id}/apply?profile={name}", status_code=303)
