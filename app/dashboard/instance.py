"""The instance page, its chart and worth fragments, and the chart JSON under /api/."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from app.charts.figures import build_figure, compact
from app.context import AppContext
from app.dashboard.chart_cache import quantise, shared_cache
from app.dashboard.memo import live_values
from app.dashboard.overview import figure_json
from app.dashboard.ranges import RANGES, TimeRange, default_range, resolve
from app.dashboard.workers import run_page_work
from app.derived.fleet import describe_offload, state_of
from app.derived.grid import MAX_POINTS
from app.derived.instance_charts import CHARTS
from app.derived.panels import Scope, make_scope
from app.derived.summary import compute_summary
from app.derived.worth import compute_worth
from app.storage.events import EventRow, list_events
from app.storage.series_store import InstanceRow, get_instance
from app.web.errors import html_error
from app.web.ids import DbId

CHART_ORDER = list(CHARTS)
SUMMARY_PX = 100  # the summary reads increases, not a chart: a coarse grid keeps its scope cheap
EVENT_KINDS = ("restart", "config_change", "counter_reset", "counter_clamped", "rollout")
PX_QUANTUM = 50  # plot widths are rounded down to this (viewers of similar widths share a computation)
RESTART_MERGE_S = 120.0  # a counter_reset this close to a restart is that restart: one annotation


def _instance(ctx: AppContext, instance_id: int) -> InstanceRow:
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


def parse_instance_id(raw: str) -> int:
    """An instance id from a URL: a positive integer, else 404 (no such page), never a traceback."""
    text = raw.strip()
    if not text.isdigit() or len(text) > 12:
        raise HTTPException(404, f"no instance {raw[:40]!r}: instance ids are numbers; see the overview")
    return int(text)


def parse_time(raw: str | None, what: str) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise HTTPException(400, f"{what} must be a Unix time in seconds, not {raw[:40]!r}") from None


def router(ctx: AppContext) -> APIRouter:
    r = APIRouter()
    # Live fragments: every viewer of an instance shares one computation per chart per quantum.
    cache = shared_cache(ctx)

    def shared_now() -> float:
        return quantise(ctx.now(), ctx.settings.chart_cache_s)

    def frame(inst: InstanceRow, tr: TimeRange, px: int = MAX_POINTS) -> tuple[Scope, list[EventRow]]:
        """What the eight fragments of one refresh share: the scope (state, grid, fetched series)
        and the events, computed once per quantum (and plot width)."""
        key = (int(inst["id"]), tr.name, tr.start, tr.end)
        sc = cache.get_or_compute(("scope", *key, px), lambda: _scope(ctx, inst, tr, px))
        events = cache.get_or_compute(("events", *key), lambda: _events(ctx, inst, tr))
        return sc, events

    def page_context(instance_id: int, range_: str | None, start: float | None, end: float | None) -> dict[str, Any]:
        inst = _instance(ctx, instance_id)
        now = ctx.now()
        if not range_ and start is None and end is None:
            range_ = default_range(now, inst.get("first_seen"))
        tr = resolve(now, range_, start, end)
        sc = _scope(ctx, inst, tr, MAX_POINTS)
        events = _events(ctx, inst, tr)
        charts = []
        for key in CHART_ORDER:
            c = chart_data(ctx, inst, key, tr, scope=sc, events=events)
            c["figure_json"] = figure_json(compact(c["figure"])) if c["figure"] else None
            charts.append(c)
        summary = compute_summary(sc)
        worth = summary.worth
        return {
            "inst": inst,
            "range": tr,
            "ranges": list(RANGES),
            "charts": charts,
            "worth": worth,
            "summary": summary,
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
        instance_id: str,
        range: str | None = None,
        start: str | None = None,
        end: str | None = None,
    ) -> HTMLResponse:
        """The instance page (viewer). Unknown or malformed ids and ranges answer an HTML page."""
        try:
            iid = parse_instance_id(instance_id)
            s, e = parse_time(start, "start"), parse_time(end, "end")
            data = await run_page_work(ctx, lambda: page_context(iid, range, s, e))
        except HTTPException as exc:
            return html_error(request, exc.status_code, str(exc.detail))
        return ctx.templates.TemplateResponse(request, "dashboard/instance.html", data)

    @r.get("/instances/{instance_id}/fragments/chart/{key}", response_class=HTMLResponse, include_in_schema=False)
    async def chart_fragment(
        request: Request,
        instance_id: DbId,
        key: str,
        range: str | None = None,
        start: float | None = None,
        end: float | None = None,
        px: int | None = Query(None, ge=1, le=20000, description="plot width in pixels"),
    ) -> HTMLResponse:
        width = plot_px(px)

        def build() -> dict[str, Any]:
            inst = _instance(ctx, instance_id)
            tr = resolve(shared_now(), range, start, end)

            def compute() -> dict[str, Any]:
                sc, events = frame(inst, tr, width)
                c = chart_data(ctx, inst, key, tr, scope=sc, events=events)
                c["figure_json"] = figure_json(compact(c["figure"])) if c["figure"] else None
                return c

            c = cache.get_or_compute(("chart", instance_id, key, tr.name, tr.start, tr.end, width), compute)
            return {"c": c, "inst": inst, "range": tr}

        data = await run_page_work(ctx, build)
        return ctx.templates.TemplateResponse(request, "dashboard/_chart.html", data)

    async def panel_fragment(
        request: Request,
        instance_id: int,
        range: str | None,
        start: float | None,
        end: float | None,
        name: str,
        compute: Callable[[Scope], Any],
    ) -> HTMLResponse:
        """A panel computed from the range's scope (worth, summary), cached per range, rendered by
        templates/dashboard/_<name>.html with the result under `name`."""

        def build() -> dict[str, Any]:
            inst = _instance(ctx, instance_id)
            tr = resolve(shared_now(), range, start, end)
            result = cache.get_or_compute(
                (name, instance_id, tr.name, tr.start, tr.end), lambda: compute(frame(inst, tr)[0])
            )
            return {name: result, "inst": inst, "range": tr}

        data = await run_page_work(ctx, build)
        return ctx.templates.TemplateResponse(request, f"dashboard/_{name}.html", data)

    @r.get("/instances/{instance_id}/fragments/worth", response_class=HTMLResponse, include_in_schema=False)
    async def worth_fragment(
        request: Request,
        instance_id: DbId,
        range: str | None = None,
        start: float | None = None,
        end: float | None = None,
    ) -> HTMLResponse:
        return await panel_fragment(request, instance_id, range, start, end, "worth", compute_worth)

    @r.get("/instances/{instance_id}/fragments/summary", response_class=HTMLResponse, include_in_schema=False)
    async def summary_fragment(
        request: Request,
        instance_id: DbId,
        range: str | None = None,
        start: float | None = None,
        end: float | None = None,
    ) -> HTMLResponse:
        """The page's opening verdict and its three numbers (role: viewer)."""

        return await panel_fragment(request, instance_id, range, start, end, "summary", compute_summary)

    @r.get("/api/v1/instances/{instance_id}/summary")
    async def summary_json(
        instance_id: DbId,
        range: str | None = Query(None, description="5m, 15m, 1h, 6h, 24h, 7d, 30d, or custom with start/end"),
        start: float | None = Query(None, description="custom range start, Unix seconds"),
        end: float | None = Query(None, description="custom range end, Unix seconds (at most 400 days after start)"),
    ) -> JSONResponse:
        """Over the range: prompt tokens by source (gpu_hit, offload_reload, recompute), the GPU,
        offload-tier and overall hit rates (0..1), and the worth verdict with the figures behind it
        (prefill_tokens_per_s, load_gbps, reloaded_tokens, saved_prefill_s). The same code as the
        instance page's header. Role: viewer."""

        def build() -> dict[str, Any]:
            inst = _instance(ctx, instance_id)
            tr = resolve(ctx.now(), range, start, end)
            sc = make_scope(
                ctx.engine,
                inst,
                start=tr.start,
                end=tr.end,
                now=ctx.now(),
                state=state_of(ctx.engine, inst, ctx.now(), ctx.settings.stale_after_s),
                raw_retention_s=ctx.settings.raw_retention_h * 3600,
                px=SUMMARY_PX,
            )
            return {"instance_id": instance_id, "range": tr.name, "state": sc.state, **compute_summary(sc).as_json()}

        return JSONResponse(await run_page_work(ctx, build))

    @r.get("/api/v1/instances/{instance_id}/charts/{key}")
    async def chart_json(
        instance_id: DbId,
        key: str,
        range: str | None = None,
        start: float | None = None,
        end: float | None = None,
        px: int = Query(MAX_POINTS, ge=50, le=4000, description="plot width in pixels (at most 600 points)"),
        tier: str | None = Query(None, pattern="^(raw|1m|1h)$", description="force a storage tier"),
    ) -> JSONResponse:
        def build() -> dict[str, Any]:
            inst = _instance(ctx, instance_id)
            tr = resolve(ctx.now(), range, start, end)
            return {**chart_data(ctx, inst, key, tr, px, tier=tier), "start": tr.start, "end": tr.end}

        return JSONResponse(await run_page_work(ctx, build))

    return r
