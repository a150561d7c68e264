"""POST /api/v1/ingest: the agents' push. The reply carries pending commands for the host."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.auth.guard import agent_host_check
from app.auth.roles import AGENT, requires
from app.context import AppContext
from app.ingest import commands as command_poll
from app.ingest.parse import BadBatch, parse_batch
from app.storage.ingest_store import SeriesCapExceeded, SeriesLimits, WriteResult
from app.web.deps import CtxDep

log = logging.getLogger("kvscope.ingest")
# Samples older than this are refused: beyond the 1 h rollups' retention, whatever a spool replays
MAX_PAST_AGE_S = 400 * 86400.0


def _store(ctx: AppContext, request: Request, body: bytes, now: float) -> tuple[WriteResult, list[dict[str, Any]]]:
    """Validate and store a push, run the push hooks, collect the host's pending commands."""
    batch = parse_batch(
        body, now, max_future_skew_s=ctx.settings.ingest.max_future_skew_s, max_past_age_s=MAX_PAST_AGE_S
    )
    agent_host_check(request, str(batch.host))  # 403 before anything is stored for another host
    limits = SeriesLimits(
        per_instance=ctx.settings.ingest.max_series_per_instance,
        new_per_push=ctx.settings.ingest.max_new_series_per_push,
        instances_per_host=ctx.settings.ingest.max_instances_per_host,
        fresh_ms=round(min(12.0, ctx.settings.storage.raw_retention_h / 4) * 3600 * 1000),
    )
    try:
        result = ctx.writer.write(batch, now, limits)
    except SeriesCapExceeded as exc:
        raise BadBatch(str(exc)) from None
    if result.duplicate:
        ctx.metrics.ingest_batches.labels("duplicate").inc()
    else:
        ctx.metrics.ingest_batches.labels("stored").inc()
        ctx.metrics.ingest_samples.inc(result.stored)
    if result.dropped_samples:
        log.warning(
            "push seq %s of %s: %d sample(s) dropped: %s",
            batch.seq,
            batch.host,
            result.dropped_samples,
            "; ".join(result.dropped[:3]),
        )
    host_id = result.host_id or 0
    for hook in ctx.push_hooks:
        try:
            hook(batch, host_id, now)
        except Exception:  # a hook must never lose the push
            log.exception("push hook failed")
    commands: list[dict[str, Any]] = []
    if host_id:
        for provider in ctx.command_providers:
            try:
                commands.extend(provider(host_id, batch.agent_id, now))
            except Exception:
                log.exception("command provider failed")
    return result, commands


router = APIRouter()


@router.post("/api/v1/ingest")
@requires(AGENT)
async def ingest(ctx: CtxDep, request: Request) -> JSONResponse:
    """Agent (bound to the batch's host): store a push. The token is checked before the body is read."""
    cap = ctx.settings.ingest.max_batch_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > cap:
                ctx.metrics.ingest_batches.labels("too_large").inc()
                return _error(413, f"batch of {declared} bytes over the {cap}-byte cap: push more often")
        except ValueError:
            return _error(400, "bad Content-Length header")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > cap:
            ctx.metrics.ingest_batches.labels("too_large").inc()
            return _error(413, f"batch over the {cap}-byte cap: push more often")
    now = ctx.now()
    try:  # one trip to a worker thread for the whole push: under load every hop waits its turn
        result, commands = await run_in_threadpool(_store, ctx, request, bytes(body), now)
    except BadBatch as exc:
        ctx.metrics.ingest_batches.labels("rejected").inc()
        return _error(422, str(exc))
    return JSONResponse(
        {
            "accepted": True,
            "duplicate": result.duplicate,
            "stored_samples": result.stored,
            # samples refused one by one (negative counters): the rest of the batch is stored
            "dropped_samples": result.dropped_samples,
            "dropped": result.dropped,
            "commands": commands,
        }
    )


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def install(app: FastAPI, ctx: AppContext) -> None:
    """The ingest part: the agents' push and the command long-poll (the same commands, sooner)."""
    app.include_router(router)
    app.include_router(command_poll.router)
