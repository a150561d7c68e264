"""The dashboard's JSON reads: /api/v1/instances, /series, /events, an instance's summary and
one chart; /healthz and the app's own /metrics."""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse, Response

from app.auth.roles import PUBLIC, VIEWER, requires
from app.dashboard.instance import SUMMARY_PX, chart_data, instance_or_404
from app.dashboard.workers import run_page_work
from app.derived.fleet import instance_state, state_of
from app.derived.grid import MAX_POINTS as CHART_MAX_POINTS
from app.derived.panels import make_scope
from app.derived.rates import gauge_series, rate_series
from app.derived.series_reader import SeriesQuery, read_series
from app.derived.summary import compute_summary
from app.storage.events import list_events
from app.storage.series_store import get_instance, list_instances
from app.web.deps import MAX_DB_ID, CtxDep, DbId, OptionalDbIdQuery, RangeQueryDep
from app.web.ranges import resolve
from kvcore.series import reset_times

MAX_POINTS = 11_000
MAX_UNIX_TS = float(2**32)  # year 2106: past it (or before 1970) a time is a typo, not a range
DEFAULT_RANGE_S = 3600.0


def resolve_range(now: float, start: float | None, end: float | None, step: float | None) -> tuple[float, float, float]:
    end_v = now if end is None else end
    start_v = end_v - DEFAULT_RANGE_S if start is None else start
    for name, v in (("start", start_v), ("end", end_v)):
        if not math.isfinite(v) or not 0.0 <= v <= MAX_UNIX_TS:
            raise HTTPException(400, f"{name} must be a Unix time in seconds, 0 to {MAX_UNIX_TS:.0f}")
    if start_v >= end_v:
        raise HTTPException(400, "start must be before end")
    step_v = step if step is not None else max(1.0, (end_v - start_v) / 300.0)
    if not math.isfinite(step_v) or step_v <= 0:
        raise HTTPException(400, "step must be a positive number of seconds")
    if (end_v - start_v) / step_v > MAX_POINTS:
        raise HTTPException(400, f"too many points: (end-start)/step must be <= {MAX_POINTS}; raise step")
    return start_v, end_v, step_v


router = APIRouter()


@router.get("/healthz")
@requires(PUBLIC)
def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@router.get("/metrics")
@requires(VIEWER)  # KVSCOPE_METRICS_PUBLIC opens it (app.auth.guard.needed_role)
def metrics(ctx: CtxDep) -> Response:
    return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/api/v1/instances")
@requires(VIEWER)
def instances(ctx: CtxDep) -> JSONResponse:
    now = ctx.now()
    # JSON body: each instance row with its state
    out = [
        {**inst, "state": instance_state(inst, now, ctx.settings.dashboard.stale_after_s)}
        for inst in list_instances(ctx.engine)
    ]
    return JSONResponse({"instances": out})


@router.get("/api/v1/series")
@requires(VIEWER)
def series(
    ctx: CtxDep,
    instance: int | None = Query(None, ge=1, le=MAX_DB_ID, description="instance id (from /api/v1/instances)"),
    host: int | None = Query(None, ge=1, le=MAX_DB_ID, description="host id, for host-level series (GPU, memory)"),
    metric: str = Query(..., min_length=1, max_length=255),
    start: float | None = None,
    end: float | None = None,
    step: float | None = None,
) -> JSONResponse:
    if (instance is None) == (host is None):
        raise HTTPException(400, "give exactly one of instance= or host=")
    if instance is not None and get_instance(ctx.engine, instance) is None:
        raise HTTPException(404, f"no instance {instance}")
    s0, s1, st = resolve_range(ctx.now(), start, end, step)
    q = SeriesQuery([metric], s0, s1, instance_id=instance, host_id=host, lookback=max(st, 60.0))
    found = read_series(ctx.engine, q)
    out = []
    resets: list[float] = []
    kind = found[0].kind if found else None
    for sp in found:
        if sp.kind == "counter":
            pts = rate_series(sp.points, s0, s1, st)
            resets.extend(t for t in reset_times(sp.points) if s0 <= t <= s1)
        else:
            pts = gauge_series(sp.points, s0, s1, st)
        out.append({"labels": sp.labels, "points": [[t, v] for t, v in pts]})
    return JSONResponse(
        {
            "metric": metric,
            "instance": instance,
            "host": host,
            "kind": kind,
            "unit": "per_second" if kind == "counter" else "value",
            "start": s0,
            "end": s1,
            "step": st,
            "series": out,
            "resets": sorted(set(resets)),
        }
    )


@router.get("/api/v1/events")
@requires(VIEWER)
def events(
    ctx: CtxDep,
    instance: OptionalDbIdQuery = None,
    start: float | None = Query(None, ge=0, le=MAX_UNIX_TS, description="Unix time in seconds"),
    end: float | None = Query(None, ge=0, le=MAX_UNIX_TS, description="Unix time in seconds"),
    limit: int = Query(500, ge=1, le=10_000),
) -> JSONResponse:
    return JSONResponse({"events": list_events(ctx.engine, instance_id=instance, start=start, end=end, limit=limit)})


@router.get("/api/v1/instances/{instance_id}/summary")
@requires(VIEWER)
async def summary_json(ctx: CtxDep, instance_id: DbId, rq: RangeQueryDep) -> JSONResponse:
    """Over the range: prompt tokens by source (gpu_hit, offload_reload, recompute), the GPU,
    offload-tier and overall hit rates (0..1), and the worth verdict with the figures behind it
    (prefill_tokens_per_s, load_gbps, reloaded_tokens, saved_prefill_s). The same code as the
    instance page's header. Role: viewer."""

    def build() -> dict[str, Any]:
        inst = instance_or_404(ctx, instance_id)
        tr = resolve(ctx.now(), rq.range, rq.start, rq.end)
        sc = make_scope(
            ctx.engine,
            inst,
            start=tr.start,
            end=tr.end,
            now=ctx.now(),
            state=state_of(ctx.engine, inst, ctx.now(), ctx.settings.dashboard.stale_after_s),
            raw_retention_s=ctx.settings.storage.raw_retention_h * 3600,
            px=SUMMARY_PX,
        )
        return {"instance_id": instance_id, "range": tr.name, "state": sc.state, **compute_summary(sc).as_json()}

    return JSONResponse(await run_page_work(ctx, build))


@router.get("/api/v1/instances/{instance_id}/charts/{key}")
@requires(VIEWER)
async def chart_json(
    ctx: CtxDep,
    instance_id: DbId,
    key: str,
    rq: RangeQueryDep,
    px: int = Query(CHART_MAX_POINTS, ge=50, le=4000, description="plot width in pixels (at most 600 points)"),
    tier: str | None = Query(None, pattern="^(raw|1m|1h)$", description="force a storage tier"),
) -> JSONResponse:
    def build() -> dict[str, Any]:
        inst = instance_or_404(ctx, instance_id)
        tr = resolve(ctx.now(), rq.range, rq.start, rq.end)
        return {**chart_data(ctx, inst, key, tr, px, tier=tier), "start": tr.start, "end": tr.end}

    return JSONResponse(await run_page_work(ctx, build))
