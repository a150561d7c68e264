"""What the cache-sizing JSON (api.py) and pages (pages.py) share: the report over a range,
with the HTTP error that says why not."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException

from app.context import AppContext
from app.sizing.curve import Figure, model_bytes_per_token
from app.sizing.service import SizingError, report
from app.web.deps import RangeQuery
from app.web.ranges import resolve

MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096


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


def sizing_report(ctx: AppContext, instance_id: int, rq: RangeQuery, model: Figure | None) -> dict[str, Any]:
    """The sizing report over the asked range (15m when none is asked)."""
    named = rq.range or ("15m" if rq.start is None and rq.end is None else None)
    tr = resolve(ctx.now(), named, rq.start, rq.end)
    try:
        out = report(ctx, instance_id, tr.start, tr.end, model_bpt=model)
    except SizingError as exc:
        raise HTTPException(exc.status, str(exc)) from None
    out["range"] = tr.name
    return out
