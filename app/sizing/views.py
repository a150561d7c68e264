"""What the cache-sizing JSON (api.py) and pages (pages.py) share: the report over a range,
with the HTTP error that says why not."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Query, Request

from app.context import AppContext
from app.sizing import checks
from app.sizing.answer import answer, host_split
from app.sizing.curve import Figure, model_bytes_per_token
from app.sizing.levers import DEFAULT_PRICE, MAX_PRICE, MIN_PRICE
from app.sizing.service import SizingError
from app.web import csrf
from app.web.deps import RangeQuery
from app.web.json_body import read_json
from app.web.ranges import TimeRange, resolve

MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096
PRICE = Query(
    DEFAULT_PRICE,
    ge=MIN_PRICE,
    le=MAX_PRICE,
    description="a GiB of pinned RAM must save this share of the computed prompt tokens (0-1, default 0.01)",
)


def model_figure(layers: int | None, kv_heads: int | None, head_dim: int | None, dtype: str | None) -> Figure | None:
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


def span(ctx: AppContext, range_: str | None, start: float | None = None, end: float | None = None) -> TimeRange:
    """The asked range (15m when none is asked)."""
    return resolve(ctx.now(), range_ or ("15m" if start is None and end is None else None), start, end)


def sizing_report(
    ctx: AppContext, instance_id: int, rq: RangeQuery, model: Figure | None, price: float = DEFAULT_PRICE
) -> dict[str, Any]:
    """The sizing answer over the asked range: the curve, every lever, the checks of past predictions."""
    tr = span(ctx, rq.range, rq.start, rq.end)
    try:
        out = answer(ctx, instance_id, tr.start, tr.end, model_bpt=model, price=price)
        out["checks"] = checks.refresh(ctx, instance_id)
    except SizingError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    out["checks_accuracy"] = checks.accuracy(out["checks"])
    out["range"] = tr.name
    return out


def host_report(ctx: AppContext, host_id: int, range_: str | None, price: float) -> dict[str, Any]:
    """The split of a host's pinned headroom across its instances."""
    tr = span(ctx, range_)
    try:
        out = host_split(ctx, host_id, tr.start, tr.end, price=price)
    except SizingError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    out["range"] = tr.name
    return out


async def json_object(request: Request, shape: str) -> dict[str, Any]:
    csrf.require_json(request)
    body = await read_json(request, f"body must be JSON: {shape}")
    if not isinstance(body, dict):
        raise HTTPException(400, f"body must be a JSON object: {shape}")
    return body
