"""Cache-sizing pages: the page and its curve fragment, and the "apply this size" form.

- ``GET /instances/{id}/sizing`` (page) and ``/instances/{id}/sizing/curve`` (fragment): viewer.
- ``POST /instances/{id}/sizing/profile`` (form): operator; saves the profile and opens the
  apply page on it, where the argv diff and preflight are reviewed before the restart (and keeps
  the prediction, to set the measured reloads of the new size against it afterwards).
- ``POST /instances/{id}/sizing/kv-events`` (form): operator; the current profile with KV events
  on, reviewed on the apply page.
- ``POST /instances/{id}/sizing/ab`` (form): operator; "A/B current vs suggested".
- ``GET /hosts/{id}/sizing`` (page): viewer; the split of the host's pinned headroom.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from app.auth.roles import OPERATOR, VIEWER, requester, requires
from app.context import AppContext
from app.controller.control import watched_urls
from app.sizing import checks, events
from app.sizing.chart import curve_svg
from app.sizing.curve import Figure
from app.sizing.levers import DEFAULT_PRICE
from app.sizing.service import SizingError, profile_for_size
from app.sizing.views import MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, host_report, model_figure, sizing_report, span
from app.storage.series_store import get_instance
from app.web import csrf
from app.web.deps import MAX_RANGE_CHARS, CtxDep, DbId, RangeQuery, RangeQueryDep
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
    who = requester(request, None)
    tr = span(ctx, str(form.get("range") or "15m")[:MAX_RANGE_CHARS])

    def work() -> str:
        try:
            name = profile_for_size(ctx, instance_id, form.get("offload_gib"), author=who)
        except SizingError as exc:
            raise HTTPException(exc.status, str(exc)) from None
        checks.watch_apply(ctx, instance_id, name, start=tr.start, end=tr.end, who=who)
        return name

    name = await run_in_threadpool(work)
    return RedirectResponse(f"/instances/{instance_id}/apply?profile={name}", status_code=303)


@router.get("/hosts/{host_id}/sizing", response_class=HTMLResponse)
@requires(VIEWER)
def host_sizing_page(
    ctx: CtxDep, host_id: DbId, request: Request, range: str | None = Query(None, max_length=MAX_RANGE_CHARS)
) -> Response:
    """Where the host's pinned headroom goes, across its instances. Role: viewer."""
    split = host_report(ctx, host_id, range, DEFAULT_PRICE)
    return csrf.render_page(
        ctx, request, "sizing/host.html", {"split": split, "ranges": list(RANGES)}, active_nav="overview"
    )


@router.post("/instances/{instance_id}/sizing/kv-events")
@requires(OPERATOR)
async def kv_events_form(ctx: CtxDep, instance_id: DbId, request: Request) -> Response:
    """Save the current profile with KV events on, then review it on the apply page. Role: operator."""
    form = await request.form()
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    who = requester(request, None)

    def work() -> str:
        try:
            return events.profile_with_events(ctx, instance_id, author=who)
        except events.EventsError as exc:
            raise HTTPException(exc.status, str(exc)) from None

    name = await run_in_threadpool(work)
    return RedirectResponse(f"/instances/{instance_id}/apply?profile={name}", status_code=303)


@router.post("/instances/{instance_id}/sizing/ab")
@requires(OPERATOR)
async def sizing_ab_form(ctx: CtxDep, instance_id: DbId, request: Request) -> Response:
    """A/B current vs suggested size; back to the sizing page, which follows it. Role: operator."""
    form = await request.form()
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    tr = span(ctx, str(form.get("range") or "15m")[:MAX_RANGE_CHARS])
    who = requester(request, None)
    try:
        await run_in_threadpool(
            lambda: checks.start_ab(
                ctx,
                instance_id,
                form.get("offload_gib"),
                runs=form.get("runs") or 3,
                start=tr.start,
                end=tr.end,
                who=who,
            )
        )
    except SizingError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    return RedirectResponse(f"/instances/{instance_id}/sizing?range={tr.name}", status_code=303)
