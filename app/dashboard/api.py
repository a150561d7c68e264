"""GET /api/v1/instances, /api/v1/series, /api/v1/events, /healthz, /metrics."""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from app.auth.roles import PUBLIC, requires
from app.context import AppContext
from app.derived.fleet import instance_state
from app.derived.rates import gauge_series, rate_series
from app.derived.series_reader import SeriesQuery, read_series
from app.storage.events import list_events
from app.storage.series_store import get_instance, list_instances
from app.web.ids import MAX_DB_ID, OptionalDbIdQuery
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


def router(ctx: AppContext) -> APIRouter:
    r = APIRouter()

    @r.get("/healthz")
    @requires(PUBLIC)
    def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @r.get("/metrics")
    def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @r.get("/api/v1/instances")
    def instances() -> JSONResponse:
        now = ctx.now()
        # JSON body: each instance row with its state
        out = [
            {**inst, "state": instance_state(inst, now, ctx.settings.stale_after_s)}
            for inst in list_instances(ctx.engine)
        ]
        return JSONResponse({"instances": out})

    @r.get("/api/v1/series")
    async def series(
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
        found = await run_in_threadpool(read_series, ctx.engine, q)
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

    @r.get("/api/v1/events")
    def events(
        instance: OptionalDbIdQuery = None,
        start: float | None = Query(None, ge=0, le=MAX_UNIX_TS, description="Unix time in seconds"),
        end: float | None = Query(None, ge=0, le=MAX_UNIX_TS, description="Unix time in seconds"),
        limit: int = Query(500, ge=1, le=10_000),
    ) -> JSONResponse:
        return JSONResponse(
            {"events": list_events(ctx.engine, instance_id=instance, start=start, end=end, limit=limit)}
        )

    return r
