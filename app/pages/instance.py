"""The instance page, its chart and worth fragments, and the chart JSON under /api/."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from app.charts.figures import build_figure
from app.context import AppContext
from app.derived.instance_charts import CHARTS
from app.derived.overview import describe_offload, state_of
from app.derived.panels import Scope, make_scope
from app.derived.worth import compute_worth
from app.pages import live_values
from app.pages.chart_cache import quantise, shared_cache
from app.pages.overview import figure_json
from app.pages.ranges import RANGES, TimeRange, resolve
from app.pages.workers import run_page_work
from app.storage.events import list_events
from app.storage.rollups import DEFAULT_PX
from app.storage.series_store import get_instance

CHART_ORDER = list(CHARTS)
EVENT_KINDS = ("restart", "config_change", "counter_reset", "counter_clamped", "rollout")


def _instance(ctx: AppContext, instance_id: int) -> dict[str, Any]:
    inst = get_instance(ctx.engine, instance_id)
    if inst is None:
        raise HTTPException(404, f"no instance {instance_id}: see the overview for the known ones")
    return inst


def _scope(
    ctx: AppContext, inst: dict[str, Any], tr: TimeRange, px: int, tier: str | None = None, live: bool = True
) -> Scope:
    """live: named ranges reuse the final values of earlier refreshes (app.derived.live)."""
    now = ctx.now()
    state = state_of(ctx.engine, inst, now, ctx.settings.stale_after_s)
    return make_scope(
        ctx.engine,
        inst,
        start=tr.start,
        end=tr.end,
        now=now,
        state=state,
        raw_retention_s=ctx.settings.raw_retention_h * 3600,
        px=px,
        tier=tier,
        live=live_values(ctx) if live and tr.name != "custom" else None,
    )


def _events(ctx: AppContext, inst: dict[str, Any], tr: TimeRange) -> list[dict[str, Any]]:
    evs = list_events(ctx.engine, instance_id=int(inst["id"]), start=tr.start, end=tr.end, kinds=EVENT_KINDS, limit=300)
    host_evs = [
        e
        for e in list_events(
            ctx.engine, host_id=int(inst["host_id"]), start=tr.start, end=tr.end, kinds=EVENT_KINDS, limit=300
        )
        if e.get("instance_id") is None
    ]
    return sorted(evs + host_evs, key=lambda e: float(e["ts"]))


def chart_data(
    ctx: AppContext,
    inst: dict[str, Any],
    key: str,
    tr: TimeRange,
    px: int = DEFAULT_PX,
    scope: Scope | None = None,
    events: list[dict[str, Any]] | None = None,
    tier: str | None = None,
) -> dict[str, Any]:
    """One chart: the Plotly figure (or why it is empty), notes, the tier and step used."""
    if key not in CHARTS:
        raise HTTPException(404, f"no chart {key!r}: charts are {', '.join(CHARTS)}")
    sc = scope or _scope(ctx, inst, tr, px, tier)
    panel = CHARTS[key](sc)
    figure = None if panel.empty else build_figure(panel, events if events is not None else _events(ctx, inst, tr))
    return {
        "key": key,
        "title": panel.title,
        "rows": len(panel.rows),
        "empty": panel.empty,
        "notes": panel.notes,
        "figure": figure,
        "tier": sc.grid.tier,
        "step": sc.grid.step,
        "points": len(sc.grid.times),
    }


def router(ctx: AppContext) -> APIRouter:
    r = APIRouter()
    # Live fragments: every viewer of an instance shares one computation per chart per quantum.
    cache = shared_cache(ctx)

    def shared_now() -> float:
        return quantise(ctx.now(), ctx.settings.chart_cache_s)

    def frame(inst: dict[str, Any], tr: TimeRange) -> tuple[Scope, list[dict[str, Any]]]:
        """What the eight fragments of one refresh share: the scope (state, grid, fetched series)
        and the events, computed once per quantum."""
        key = (int(inst["id"]), tr.name, tr.start, tr.end)
        sc = cache.get_or_compute(("scope", *key), lambda: _scope(ctx, inst, tr, DEFAULT_PX))
        events = cache.get_or_compute(("events", *key), lambda: _events(ctx, inst, tr))
        return sc, events

    def page_context(instance_id: int, range_: str | None, start: float | None, end: float | None) -> dict[str, Any]:
        inst = _instance(ctx, instance_id)
        tr = resolve(ctx.now(), range_, start, end)
        sc = _scope(ctx, inst, tr, DEFAULT_PX)
        events = _events(ctx, inst, tr)
        charts = []
        for key in CHART_ORDER:
            c = chart_data(ctx, inst, key, tr, scope=sc, events=events)
            c["figure_json"] = figure_json(c["figure"]) if c["figure"] else None
            charts.append(c)
        worth = compute_worth(sc)
        return {
            "inst": inst,
            "range": tr,
            "ranges": list(RANGES),
            "charts": charts,
            "worth": worth,
            "state": sc.state,
            "offload": describe_offload(inst),
            "now": ctx.now(),
            "simulated": bool(inst.get("simulated")),
            "events": events[-20:],
            "active_nav": "overview",
            "tier": sc.grid.tier,
        }

    @r.get("/instances/{instance_id}", response_class=HTMLResponse, include_in_schema=False)
    async def instance_page(
        request: Request,
        instance_id: int,
        range: str | None = None,
        start: float | None = None,
        end: float | None = None,
    ) -> HTMLResponse:
        data = await run_page_work(ctx, lambda: page_context(instance_id, range, start, end))
        return ctx.extras["templates"].TemplateResponse(request, "dashboard/instance.html", data)  # type: ignore[no-any-return]

    @r.get("/instances/{instance_id}/fragments/chart/{key}", response_class=HTMLResponse, include_in_schema=False)
    async def chart_fragment(
        request: Request,
        instance_id: int,
        key: str,
        range: str | None = None,
        start: float | None = None,
        end: float | None = None,
    ) -> HTMLResponse:
        def build() -> dict[str, Any]:
            inst = _instance(ctx, instance_id)
            tr = resolve(shared_now(), range, start, end)

            def compute() -> dict[str, Any]:
                sc, events = frame(inst, tr)
                c = chart_data(ctx, inst, key, tr, scope=sc, events=events)
                c["figure_json"] = figure_json(c["figure"]) if c["figure"] else None
                return c

            c = cache.get_or_compute(("chart", instance_id, key, tr.name, tr.start, tr.end), compute)
            return {"c": c, "inst": inst, "range": tr}

        data = await run_page_work(ctx, build)
        return ctx.extras["templates"].TemplateResponse(request, "dashboard/_chart.html", data)  # type: ignore[no-any-return]

    @r.get("/instances/{instance_id}/fragments/worth", response_class=HTMLResponse, include_in_schema=False)
    async def worth_fragment(
        request: Request,
        instance_id: int,
        range: str | None = None,
        start: float | None = None,
        end: float | None = None,
    ) -> HTMLResponse:
        def build() -> dict[str, Any]:
            inst = _instance(ctx, instance_id)
            tr = resolve(shared_now(), range, start, end)
            worth = cache.get_or_compute(
                ("worth", instance_id, tr.name, tr.start, tr.end),
                lambda: compute_worth(frame(inst, tr)[0]),
            )
            return {"worth": worth, "inst": inst, "range": tr}

        data = await run_page_work(ctx, build)
        return ctx.extras["templates"].TemplateResponse(request, "dashboard/_worth.html", data)  # type: ignore[no-any-return]

    @r.get("/api/v1/instances/{instance_id}/charts/{key}")
    async def chart_json(
        instance_id: int,
        key: str,
        range: str | None = None,
        start: float | None = None,
        end: float | None = None,
        px: int = Query(DEFAULT_PX, ge=50, le=4000, description="plot width in pixels"),
        tier: str | None = Query(None, pattern="^(raw|1m|1h)$", description="force a storage tier"),
    ) -> JSONResponse:
        def build() -> dict[str, Any]:
            inst = _instance(ctx, instance_id)
            tr = resolve(ctx.now(), range, start, end)
            return {**chart_data(ctx, inst, key, tr, px, tier=tier), "start": tr.start, "end": tr.end}

        return JSONResponse(await run_page_work(ctx, build))

    return r
