"""Cache-sizing routes: the JSON curve, the page and its fragment, "apply this size".

- ``GET /api/v1/instances/{id}/sizing`` (alias ``/cache-sizing``): viewer.
- ``POST /api/v1/instances/{id}/sizing/profile`` ``{"offload_gib": x, "request_rollout": bool}``:
  operator; saves the sized profile and, when asked, requests its rollout (the usual flow).
- ``GET /instances/{id}/sizing`` (page) and ``/instances/{id}/sizing/curve`` (fragment): viewer.
- ``POST /instances/{id}/sizing/profile`` (form): operator; saves the profile and opens the
  apply page on it, where the argv diff and preflight are reviewed before the restart (and keeps
  the prediction, to set the measured reloads of the new size against it afterwards).
- ``POST /api/v1/instances/{id}/sizing/kv-events`` ``{"request_rollout": bool}`` and the form
  ``POST /instances/{id}/sizing/kv-events``: operator; the current profile with KV events on.
- ``POST /api/v1/instances/{id}/sizing/ab`` ``{"offload_gib": x, "runs": 3..10}`` and the form
  ``POST /instances/{id}/sizing/ab``: operator; "A/B current vs suggested" (app/sizing/checks.py).
- ``GET /api/v1/hosts/{id}/sizing`` and the page ``/hosts/{id}/sizing``: viewer; the split of
  the host's pinned headroom across its instances.
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
from app.sizing import checks, events
from app.sizing.answer import answer, host_split
from app.sizing.chart import curve_svg
from app.sizing.curve import Figure, model_bytes_per_token
from app.sizing.levers import DEFAULT_PRICE, MAX_PRICE, MIN_PRICE
from app.sizing.service import SizingError, profile_for_size
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


def _span(ctx: AppContext, range_: str | None, start: float | None, end: float | None) -> Any:
    return resolve(ctx.now(), range_ or ("15m" if start is None and end is None else None), start, end)


def _report(
    ctx: AppContext,
    instance_id: int,
    range_: str | None,
    start: float | None,
    end: float | None,
    model: Figure | None,
    price: float = DEFAULT_PRICE,
) -> dict[str, Any]:
    tr = _span(ctx, range_, start, end)
    try:
        out = answer(ctx, instance_id, tr.start, tr.end, model_bpt=model, price=price)
        out["checks"] = checks.refresh(ctx, instance_id)
    except SizingError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    out["checks_accuracy"] = checks.accuracy(out["checks"])
    out["range"] = tr.name
    return out


def _host_report(ctx: AppContext, host_id: int, range_: str | None, price: float) -> dict[str, Any]:
    tr = _span(ctx, range_, None, None)
    try:
        out = host_split(ctx, host_id, tr.start, tr.end, price=price)
    except SizingError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    out["range"] = tr.name
    return out


PRICE = Query(
    DEFAULT_PRICE,
    ge=MIN_PRICE,
    le=MAX_PRICE,
    description="a GiB of pinned RAM must save this share of the computed prompt tokens (0-1, default 0.01)",
)


async def _json_object(request: Request, shape: str) -> dict[str, Any]:
    csrf.require_json(request)
    body = await read_json(request, f"body must be JSON: {shape}")
    if not isinstance(body, dict):
        raise HTTPException(400, f"body must be a JSON object: {shape}")
    return body


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
        price: float = PRICE,
    ) -> JSONResponse:
        """The hit-rate-vs-tier-size curve of an instance, every lever, the host split. Role: viewer."""
        model = _model_figure(layers, kv_heads, head_dim, dtype)
        return JSONResponse(await run_in_threadpool(_report, ctx, instance_id, range, start, end, model, price))

    @r.get("/api/v1/hosts/{host_id}/sizing")
    @requires(VIEWER)
    async def host_sizing_api(
        host_id: DbId,
        range: str | None = Query(None, max_length=16, description=f"one of {', '.join(RANGES)} (default 15m)"),
        price: float = PRICE,
    ) -> JSONResponse:
        """The split of a host's pinned headroom across its instances. Role: viewer."""
        return JSONResponse(await run_in_threadpool(_host_report, ctx, host_id, range, price))

    @r.post("/api/v1/instances/{instance_id}/sizing/kv-events")
    @requires(OPERATOR)
    async def kv_events_api(instance_id: DbId, request: Request) -> JSONResponse:
        """Save the current profile with KV events on; with request_rollout, roll it out. Role: operator."""
        body = await _json_object(request, '{"request_rollout": bool}')
        who = requester(request, None)
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
        return JSONResponse(out, status_code=201)

    @r.post("/api/v1/instances/{instance_id}/sizing/ab")
    @requires(OPERATOR)
    async def sizing_ab_api(instance_id: DbId, request: Request) -> JSONResponse:
        """A/B the current tier size against a suggested one; keeps the check. Role: operator."""
        body = await _json_object(request, '{"offload_gib": number, "runs": 3-10, "range": "15m"}')
        rng = body.get("range")
        if rng is not None and not isinstance(rng, str):
            raise HTTPException(400, "range must be a string such as 15m")
        tr = _span(ctx, rng, None, None)
        try:
            out = await run_in_threadpool(
                lambda: checks.start_ab(
                    ctx,
                    instance_id,
                    body.get("offload_gib"),
                    runs=body.get("runs", 3),
                    start=tr.start,
                    end=tr.end,
                    who=requester(request, None),
                )
            )
        except SizingError as exc:
            raise HTTPException(exc.status, str(exc)) from None
        return JSONResponse(out, status_code=201)

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

    def view(instance_id: int, range_: str | None, start: float | None, end: float | None) -> dict[str, Any]:
        rep = _report(ctx, instance_id, range_, start, end, None)
        return {"rep": rep, "svg": curve_svg(rep), "ranges": list(RANGES), "simulated": rep["simulated"]}

    @r.get("/hosts/{host_id}/sizing", response_class=HTMLResponse)
    @requires(VIEWER)
    def host_sizing_page(host_id: DbId, request: Request, range: str | None = Query(None, max_length=16)) -> Response:
        """Where the host's pinned headroom goes, across its instances. Role: viewer."""
        split = _host_report(ctx, host_id, range, DEFAULT_PRICE)
        return render(request, "sizing/host.html", {"split": split, "ranges": list(RANGES)})

    @r.post("/instances/{instance_id}/sizing/kv-events")
    @requires(OPERATOR)
    async def kv_events_form(instance_id: DbId, request: Request) -> Response:
        """Save the current profile with KV events on, then review it on the apply page. Role: operator."""
        form = await request.form()
        csrf.check(request, form.get(csrf.FIELD), ctx.secret)
        try:
            name = events.profile_with_events(ctx, instance_id, author=requester(request, None))
        except events.EventsError as exc:
            raise HTTPException(exc.status, str(exc)) from None
        return RedirectResponse(f"/instances/{instance_id}/apply?profile={name}", status_code=303)

    @r.post("/instances/{instance_id}/sizing/ab")
    @requires(OPERATOR)
    async def sizing_ab_form(instance_id: DbId, request: Request) -> Response:
        """A/B current vs suggested size; back to the sizing page, which follows it. Role: operator."""
        form = await request.form()
        csrf.check(request, form.get(csrf.FIELD), ctx.secret)
        rng = str(form.get("range") or "15m")
        tr = _span(ctx, rng, None, None)
        try:
            await run_in_threadpool(
                lambda: checks.start_ab(
                    ctx,
                    instance_id,
                    form.get("offload_gib"),
                    runs=form.get("runs") or 3,
                    start=tr.start,
                    end=tr.end,
                    who=requester(request, None),
                )
            )
        except SizingError as exc:
            raise HTTPException(exc.status, str(exc)) from None
        return RedirectResponse(f"/instances/{instance_id}/sizing?range={tr.name}", status_code=303)

    @r.get("/instances/{instance_id}/sizing", response_class=HTMLResponse)
    @requires(VIEWER)
    def sizing_page(
        instance_id: DbId,
        request: Request,
        range: str | None = Query(None, max_length=16),
        start: float | None = None,
        end: float | None = None,
    ) -> Response:
        """How big should the offload tier be? Role: viewer."""
        return render(request, "sizing/page.html", view(instance_id, range, start, end))

    @r.get("/instances/{instance_id}/sizing/curve", response_class=HTMLResponse)
    @requires(VIEWER)
    def sizing_fragment(
        instance_id: DbId,
        request: Request,
        range: str | None = Query(None, max_length=16),
        start: float | None = None,
        end: float | None = None,
    ) -> Response:
        """The curve fragment (htmx refresh). Role: viewer."""
        return render(request, "sizing/_curve.html", view(instance_id, range, start, end))

    @r.post("/instances/{instance_id}/sizing/profile")
    @requires(OPERATOR)
    async def sizing_profile_form(instance_id: DbId, request: Request) -> Response:
        """Save the sized profile, then review it on the apply page. Role: operator."""
        form = await request.form()
        csrf.check(request, form.get(csrf.FIELD), ctx.secret)
        who = requester(request, None)
        try:
            name = profile_for_size(ctx, instance_id, form.get("offload_gib"), author=who)
        except SizingError as exc:
            raise HTTPException(exc.status, str(exc)) from None
        tr = _span(ctx, str(form.get("range") or "15m"), None, None)
        await run_in_threadpool(checks.watch_apply, ctx, instance_id, name, start=tr.start, end=tr.end, who=who)
        return RedirectResponse(f"/instances/{instance_id}/apply?profile={name}", status_code=303)

    return r
