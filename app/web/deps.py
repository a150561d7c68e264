"""The typed dependencies every route takes instead of a closure over the context.

A route is a plain module function on its part's module-level `APIRouter`:

    router = APIRouter()

    @router.get("/api/v1/rollouts/{rollout_id}")
    @requires(VIEWER)
    def get_rollout(ctx: CtxDep, rollout_id: DbId) -> JSONResponse: ...

- `CtxDep`: the app's `AppContext` (built once in create_app, kept on `app.state.ctx`).
- `RangeQueryDep`: the shared `range` / `start` / `end` query parameters of the dashboard's and
  sizing's reads, resolved to a `TimeRange` by `app.web.ranges.resolve` in the route.
- `DbId` / `OptionalDbIdQuery`: database ids, 1 to 2^31-1 (app/web/ids.py), a 422 outside it.

Sync or async: a route is a sync `def` (FastAPI runs it in its thread pool) unless it awaits
something (a request body or form, the dashboard's page-work limiter, the long-poll); only then
is it `async def`. The dependencies here are `async def` because they only read the request:
a sync one would cost every request a thread-pool hop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query, Request

from app.context import AppContext
from app.web.ids import MAX_DB_ID, DbId, OptionalDbIdQuery

__all__ = [
    "MAX_DB_ID",
    "MAX_RANGE_CHARS",
    "CtxDep",
    "DbId",
    "OptionalDbIdQuery",
    "RangeQuery",
    "RangeQueryDep",
    "get_ctx",
]


async def get_ctx(request: Request) -> AppContext:
    """The context of the app that serves this request."""
    ctx = request.app.state.ctx
    if not isinstance(ctx, AppContext):
        raise TypeError(f"app.state.ctx is a {type(ctx).__name__}, not an AppContext")
    return ctx


CtxDep = Annotated[AppContext, Depends(get_ctx)]
MAX_RANGE_CHARS = 16  # the longest range name is "custom"; a longer one is a 422, not a lookup


@dataclass(frozen=True)
class RangeQuery:
    """The range a read covers, as the query string gave it (not yet checked: `resolve` does)."""

    range: str | None = None
    start: float | None = None
    end: float | None = None


async def range_query(
    range: Annotated[
        str | None,
        Query(max_length=MAX_RANGE_CHARS, description="5m, 15m, 1h, 6h, 24h, 7d, 30d, or custom with start/end"),
    ] = None,
    start: Annotated[float | None, Query(description="custom range start, a Unix time in seconds")] = None,
    end: Annotated[
        float | None, Query(description="custom range end, a Unix time in seconds (at most 400 days after start)")
    ] = None,
) -> RangeQuery:
    return RangeQuery(range, start, end)


RangeQueryDep = Annotated[RangeQuery, Depends(range_query)]
