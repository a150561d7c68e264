"""The instance page and its fragments (chart, worth, summary), and the computations they share
with the instance JSON reads (app/dashboard/api.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from app.auth.roles import VIEWER, requires
from app.charts.figures import build_figure, compact
from app.context import AppContext
from app.dashboard.chart_cache import quantise, shared_cache
from app.dashboard.memo import live_values
from app.dashboard.overview import figure_json
from app.dashboard.workers import run_page_work
from app.derived.fleet import describe_offload, state_of
from app.derived.grid import MAX_POINTS
from app.derived.instance_charts import CHARTS
from app.derived.panels import Scope, make_scope
from app.derived.summary import compute_summary
from app.derived.worth import compute_worth
from app.storage.events import EventRow, list_events
from app.storage.series_store import InstanceRow, get_instance
from app.web.deps import CtxDep, DbId, RangeQuery, RangeQueryDep
from app.web.ranges import RANGES, TimeRange, default_range, resolve

CHART_ORDER = list(CHARTS)
SUMMARY_PX = 100  # the summary reads increases, not a chart: a coarse grid keeps its scope cheap
EVENT_KINDS = ("restart", "config_change", "counter_reset", "counter_clamped", "rollout")
PX_QUANTUM = 50  # plot widths are rounded down to this (viewers of similar widths share a computation)
RESTART_MERGE_S = 120.0  # a counter_reset this close to a restart is that restart: one annotation


def instance_or_404(ctx: AppContext, instance_id: int) -> InstanceRow:
    inst = get_instance(ctx.engine, instance_id)
    if inst is None:
        raise HTTPException(404, f"no instance {instance_id}: see the overview for the known ones")
    return inst


def plot_px(px: int | None) -> int:
    """The grid's width: the plot width the page sent, rounded down to PX_QUANTUM (MAX_POINTS when
    not sent or out of range; make_grid caps it)."""
    if px is None or px < PX_QUANTUM:
        return MAX_POINTS
    return min(MAX_POINTS, px - px % PX_QUANTUM)


def merge_restarts(events: list[EventRow]) -> list[EventRow]:
    """One restart, one annotation: a counter_reset within RESTART_MERGE_S of a restart of the same
    instance is the restart's own consequence, so it is folded into the restart's message."""
    restarts = [e for e in events if e.get("kind") == "restart"]
    out: list[EventRow] = []
    for e in events:
        if e.get("kind") == "counter_reset" and any(
            r.get("instance_id") == e.get("instance_id") and abs(float(r["ts"]) - float(e["ts"])) <= RESTART_MERGE_S
            for r in restarts
        ):
            continue
        out.append(e)
    return out


def _scope(
    ctx: AppContext, inst: InstanceRow, tr: TimeRange, px: int, tier: str | None = None, live: bool = True
) -> Scope:
    """live: named ranges reuse the final values of earlier refreshes (app.derived.live)."""
    now = ctx.now()
    state = state_of(ctx.engine, inst, now, ctx.settings.dashboard.stale_after_s)
    return make_scope(
        ctx.engine,
        inst,
        start=tr.start,
        end=tr.end,
        now=now,
        state=state,
        raw_retention_s=ctx.settings.storage.raw_retention_h * 3600,
        px=px,
        tier=tier,
        live=live_values(ctx) if live and tr.name != "custom" else None,
    )


def _events(ctx: AppContext, inst: InstanceRow, tr: TimeRange) -> list[EventRow]:
    evs = list_events(ctx.engine, instance_id=int(inst["id"]), start=tr.start, end=tr.end, kinds=EVENT_KINDS, limit=300)
    host_evs = [
        e
        for e in list_events(
            ctx.engine, host_id=int(inst["host_id"]), start=tr.start, end=tr.end, kinds=EVENT_KINDS, limit=300
        )
        if e.get("instance_id") is None
    ]
    return merge_restarts(sorted(evs + host_evs, key=lambda e: float(e["ts"])))


def chart_data(
    ctx: AppContext,
    inst: InstanceRow,
    key: str,
    tr: TimeRange,
    px: int = MAX_POINTS,
    scope: Scope | None = None,
    events: list[EventRow] | None = None,
    tier: str | None = None,
) -> dict[str, Any]:
    """One chart: the Plotly figure (or why it is empty), notes, the tier and step used."""
    if key not in CHARTS:
        raise HTTPException(404, f"no chart {key!r}: charts are {', '.join(CHARTS)}")
    sc = scope or _scope(ctx, inst, tr, px, tier)
    panel = CHARTS[key](sc)
    evs = events if events is not None else _events(ctx, inst, tr)
    figure = None if panel.empty else build_figure(panel, evs, data_since=_float(inst.get("first_seen")))
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


def _float(v: object) -> float | None:
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def shared_now(ctx: AppContext) -> float:
    """Now, rounded to the chart cache's quantum: live fragments of one refresh share it."""
    return quantise(ctx.now(), ctx.settings.dashboard.chart_cache_s)


def frame(ctx: AppContext, inst: InstanceRow, tr: TimeRange, px: int = MAX_POINTS) -> tuple[Scope, list[EventRow]]:
    """What the eight fragments of one refresh share: the scope (state, grid, fetched series)
    and the events, computed once per quantum (and plot width). Every viewer of an instance
    shares one computation per chart per quantum (the app's shared_cache)."""
    cache = shared_cache(ctx)
    key = (int(inst["id"]), tr.name, tr.start, tr.end)
    sc = cache.get_or_compute(("scope", *key, px), lambda: _scope(ctx, inst, tr, px))
    events = cache.get_or_compute(("events", *key), lambda: _events(ctx, inst, tr))
    return sc, events


def _chart_with_json(
    ctx: AppContext, inst: InstanceRow, key: str, tr: TimeRange, sc: Scope, events: list[EventRow]
) -> dict[str, Any]:
    c = chart_data(ctx, inst, key, tr, scope=sc, events=events)
    c["figure_json"] = figure_json(compact(c["figure"])) if c["figure"] else None
    return c


def page_context(ctx: AppContext, instance_id: int, rq: RangeQuery) -> dict[str, Any]:
    """Everything the instance page renders: its charts, summary, worth, state and events."""
    inst = instance_or_404(ctx, instance_id)
    now = ctx.now()
    range_ = rq.range
    if not range_ and rq.start is None and rq.end is None:
        range_ = default_range(now, inst.get("first_seen"))
    tr = resolve(now, range_, rq.start, rq.end)
    sc = _scope(ctx, inst, tr, MAX_POINTS)
    events = _events(ctx, inst, tr)
    charts = [_chart_with_json(ctx, inst, key, tr, sc, events) for key in CHART_ORDER]
    summary = compute_summary(sc)
    return {
        "inst": inst,
        "range": tr,
        "ranges": list(RANGES),
        "charts": charts,
        "worth": summary.worth,
        "summary": summary,
        "state": sc.state,
        "offload": describe_offload(inst),
        "now": ctx.now(),
        "simulated": bool(inst.get("simulated")),
        "events": events[-20:],
        "active_nav": "overview",
        "tier": sc.grid.tier,
    }


def chart_fragment_data(ctx: AppContext, instance_id: int, key: str, rq: RangeQuery, width: int) -> dict[str, Any]:
    """One chart of a live refresh, shared by every viewer of the same range and width."""
    inst = instance_or_404(ctx, instance_id)
    tr = resolve(shared_now(ctx), rq.range, rq.start, rq.end)

    def compute() -> dict[str, Any]:
        return _chart_with_json(ctx, inst, key, tr, *frame(ctx, inst, tr, width))

    c = shared_cache(ctx).get_or_compute(("chart", instance_id, key, tr.name, tr.start, tr.end, width), compute)
    return {"c": c, "inst": inst, "range": tr}


def panel_data(
    ctx: AppContext, instance_id: int, rq: RangeQuery, name: str, compute: Callable[[Scope], Any]
) -> dict[str, Any]:
    """A panel computed from the range's scope (worth, summary), cached per range; the result is
    under `name` for templates/dashboard/_<name>.html."""
    inst = instance_or_404(ctx, instance_id)
    tr = resolve(shared_now(ctx), rq.range, rq.start, rq.end)
    result = shared_cache(ctx).get_or_compute(
        (name, instance_id, tr.name, tr.start, tr.end), lambda: compute(frame(ctx, inst, tr)[0])
    )
    return {name: result, "inst": inst, "range": tr}


router = APIRouter(include_in_schema=False)


@router.get("/instances/{instance_id}", response_class=HTMLResponse)
@requires(VIEWER)
async def instance_page(ctx: CtxDep, request: Request, instance_id: DbId, rq: RangeQueryDep) -> HTMLResponse:
    """The instance page. An unknown or malformed id or range answers an HTML page in the
    dashboard's frame (app/web/errors.py), as every page route does."""
    data = await run_page_work(ctx, lambda: page_context(ctx, instance_id, rq))
    return ctx.templates.TemplateResponse(request, "dashboard/instance.html", data)


@router.get("/instances/{instance_id}/fragments/chart/{key}", response_class=HTMLResponse)
@requires(VIEWER)
async def chart_fragment(
    ctx: CtxDep,
    request: Request,
    instance_id: DbId,
    key: str,
    rq: RangeQueryDep,
    px: int | None = Query(None, ge=1, le=20000, description="plot width in pixels"),
) -> HTMLResponse:
    width = plot_px(px)
    data = await run_page_work(ctx, lambda: chart_fragment_data(ctx, instance_id, key, rq, width))
    return ctx.templates.TemplateResponse(request, "dashboard/_chart.html", data)


@router.get("/instances/{instance_id}/fragments/worth", response_class=HTMLResponse)
@requires(VIEWER)
async def worth_fragment(ctx: CtxDep, request: Request, instance_id: DbId, rq: RangeQueryDep) -> HTMLResponse:
    data = await run_page_work(ctx, lambda: panel_data(ctx, instance_id, rq, "worth", compute_worth))
    return ctx.templates.TemplateResponse(request, "dashboard/_worth.html", data)


@router.get("/instances/{instance_id}/fragments/summary", response_class=HTMLResponse)
@requires(VIEWER)
async def summary_fragment(ctx: CtxDep, request: Request, instance_id: DbId, rq: RangeQueryDep) -> HTMLResponse:
    """The page's opening verdict and its three numbers."""
    data = await run_page_work(ctx, lambda: panel_data(ctx, instance_id, rq, "summary", compute_summary))
    return ctx.templates.TemplateResponse(request, "dashboard/_summary.html", data)
