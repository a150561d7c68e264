"""GET /api/v1/prometheus/instances/{id}/charts/{key}: the dashboard's chart JSON with the
instance's series read from Prometheus (same figure code, same events from the store)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.responses import JSONResponse

from app.auth.roles import VIEWER, requires
from app.context import AppContext
from app.dashboard.instance import chart_data, instance_or_404
from app.derived.fleet import state_of
from app.export.prometheus_source import PrometheusSource, prometheus_scope, source_from_settings
from app.web.deps import CtxDep, DbId, RangeQuery, RangeQueryDep
from app.web.ranges import resolve


def install(app: FastAPI, ctx: AppContext) -> None:
    app.include_router(router)


def prometheus_chart(
    ctx: AppContext, source: PrometheusSource, instance_id: int, key: str, rq: RangeQuery
) -> dict[str, Any]:
    inst = instance_or_404(ctx, instance_id)
    tr = resolve(ctx.now(), rq.range, rq.start, rq.end)
    now = ctx.now()
    sc = prometheus_scope(
        source,
        ctx.engine,
        inst,
        start=tr.start,
        end=tr.end,
        now=now,
        state=state_of(ctx.engine, inst, now, ctx.settings.dashboard.stale_after_s),
    )
    out = chart_data(ctx, inst, key, tr, scope=sc)
    out["source"] = "prometheus"
    if sc.error:
        out["error"] = sc.error
    return out


router = APIRouter()


@router.get("/api/v1/prometheus/instances/{instance_id}/charts/{key}", response_model=None)
@requires(VIEWER)
def prom_chart(ctx: CtxDep, instance_id: DbId, key: str, rq: RangeQueryDep) -> JSONResponse:
    source = source_from_settings(ctx.settings)
    if source is None:
        raise HTTPException(404, "no Prometheus configured: set KVSCOPE_PROMETHEUS_URL (prometheus_url)")
    data = prometheus_chart(ctx, source, instance_id, key, rq)
    if data.get("error") and data.get("figure") is None:
        return JSONResponse(data, status_code=502)
    return JSONResponse(data)
