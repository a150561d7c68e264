"""GET / (overview page) and /fragments/overview (its refreshed list)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.auth.roles import VIEWER, requires
from app.charts import palette
from app.charts.figures import sparkline
from app.context import AppContext
from app.dashboard.chart_cache import quantise, shared_cache
from app.dashboard.memo import live_values
from app.dashboard.workers import run_page_work
from app.derived.fleet import HostOverview, InstanceOverview, overview
from app.storage.series_store import HostRow
from app.storage.store_budget import store_usage
from app.web.deps import CtxDep
from app.web.templating import script_json

STORAGE_REFRESH_S = 60.0
LIVE_REFRESH_S = 15.0  # the dashboard's live refresh (static/js); the overview list changes no faster


def figure_json(fig: dict[str, Any]) -> str:
    """JSON safe to embed in a <script type="application/json"> element (no raw <, >, &)."""
    return str(script_json(fig))


class InstanceCard(InstanceOverview):
    """An instance of the overview list, with its sparklines drawn."""

    spark_figs: dict[str, str]  # hit | ttft95 -> the sparkline figure's JSON


class HostCard(HostRow):
    """A host of the overview list, its instances as cards."""

    instances: list[InstanceCard]
    stale: bool


def _card(inst: InstanceOverview) -> InstanceCard:
    figs = {}
    if "hit" in inst["sparks"]:
        figs["hit"] = figure_json(sparkline(inst["spark_times"], inst["sparks"]["hit"], "%", palette.SPARK["hit"]))
    if "ttft95" in inst["sparks"]:
        figs["ttft95"] = figure_json(
            sparkline(inst["spark_times"], inst["sparks"]["ttft95"], "ms", palette.SPARK["ttft95"])
        )
    return {**inst, "spark_figs": figs}


def _host_card(h: HostOverview) -> HostCard:
    return {**h, "instances": [_card(i) for i in h["instances"]]}


def _context(ctx: AppContext) -> dict[str, Any]:
    now = ctx.now()
    hosts = [
        _host_card(h)
        for h in overview(
            ctx.engine,
            now,
            ctx.settings.dashboard.stale_after_s,
            ctx.settings.storage.raw_retention_h * 3600,
            live=live_values(ctx),
        )
    ]
    simulated = any(i.get("simulated") for h in hosts for i in h["instances"])
    return {"hosts": hosts, "now": now, "simulated": simulated, "active_nav": "overview"}


def _storage(ctx: AppContext) -> dict[str, Any]:
    """The storage panel's figures: a pass over the chunk rows, so shared for STORAGE_REFRESH_S."""
    budget = int(ctx.settings.storage.budget_mb * 1_000_000)
    cache = shared_cache(ctx)
    key = ("storage", quantise(ctx.now(), STORAGE_REFRESH_S))
    usage = cache.get_or_compute(key, lambda: store_usage(ctx.engine, budget), STORAGE_REFRESH_S)
    return {"st": usage, "raw_retention_h": ctx.settings.storage.raw_retention_h}


router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
@requires(VIEWER)
async def overview_page(ctx: CtxDep, request: Request) -> HTMLResponse:
    data = await run_page_work(ctx, lambda: {**_context(ctx), **_storage(ctx)})
    return ctx.templates.TemplateResponse(request, "dashboard/overview.html", data)


@router.get("/fragments/overview", response_class=HTMLResponse)
@requires(VIEWER)
async def overview_fragment(ctx: CtxDep, request: Request) -> HTMLResponse:
    # the live refresh: every open overview shares one computation per refresh interval
    cache = shared_cache(ctx)
    quantum = (
        max(ctx.settings.dashboard.chart_cache_s, LIVE_REFRESH_S) if ctx.settings.dashboard.chart_cache_s > 0 else 0.0
    )
    key = ("overview", quantise(ctx.now(), quantum))
    data = await run_page_work(ctx, lambda: cache.get_or_compute(key, lambda: _context(ctx), quantum))
    return ctx.templates.TemplateResponse(request, "dashboard/_instances.html", data)
