"""Cache sizing: how big should the offload tier be? See docs/cache-sizing.md."""

from __future__ import annotations

from fastapi import FastAPI

from app.context import AppContext
from app.sizing import api, pages, service
from app.web.jobs import register_job


def install(app: FastAPI, ctx: AppContext) -> None:
    ctx.push_hooks.append(service.push_hook(ctx))
    register_job(ctx, service.PRUNE_JOB, service.prune_job, 3600.0)
    app.include_router(api.router)
    app.include_router(pages.router)
