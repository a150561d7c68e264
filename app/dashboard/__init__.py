"""The dashboard: pages, fragments, static assets and the rollup job.

install(app, ctx) mounts /static (plotly.js there is the cartesian partial bundle of npm's
plotly.js-cartesian-dist-min 4.1.1, MIT, see static/vendor/plotly.LICENSE: 1.5 MB, not the full
build's 4.8 MB), registers the JSON read API, the page routes and the rollup job. The Jinja2 environment is
ctx.templates (built once in create_app; the other parts add their globals to it).
"""

from __future__ import annotations

import gc

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app.auth.roles import PUBLIC, requires
from app.context import AppContext
from app.dashboard import api, instance, overview
from app.dashboard.memo import live_values
from app.paths import static_dir
from app.storage.chunk_seal import seal_head
from app.storage.rollups import run_rollups
from app.storage.store_budget import apply_budget
from app.web.jobs import register_job

# Rollups fold raw samples older than 2 min into 1 min / 1 h rows: once a minute keeps the 1 min
# tier at most one bucket behind; more often only repeats empty passes
ROLLUP_INTERVAL_S = 60.0


def install(app: FastAPI, ctx: AppContext) -> None:
    live_values(ctx)  # the memo of final chart values: valid per series write generation, no push hook
    app.include_router(api.router)  # JSON reads: instances, series, events, summary, charts, /healthz, /metrics
    # a mount is outside the app-wide role check: PUBLIC says so in the route table
    app.mount("/static", requires(PUBLIC)(StaticFiles(directory=str(static_dir()))), name="static")
    app.include_router(overview.router)
    app.include_router(instance.router)
    register_job(ctx, ROLLUP_JOB, rollup_job, ROLLUP_INTERVAL_S)
    register_job(ctx, SEAL_JOB, seal_job, ctx.settings.storage.seal_interval_s)
    _freeze_once()


_FROZEN: list[bool] = []


def _freeze_once() -> None:
    """Once per process: the modules imported and the app built live as long as the process, so
    move them out of the cyclic GC's reach; the full collections that chart requests trigger
    (tens of thousands of buckets each) then stop rescanning them (measured: 30-day latency
    chart 143 -> 66 ms median). Garbage is collected first, so nothing dead is kept."""
    if _FROZEN:
        return
    gc.collect()
    gc.freeze()
    _FROZEN.append(True)


ROLLUP_JOB = "rollups"


def rollup_job(ctx: AppContext, now: float) -> None:
    """Roll raw samples up to 1 min / 1 h and apply the retention settings."""
    s = ctx.settings.storage
    run_rollups(
        ctx.engine,
        now,
        raw_retention_s=s.raw_retention_h * 3600,
        m1_retention_s=s.rollup_1m_retention_d * 86400,
        h1_retention_s=s.rollup_1h_retention_d * 86400,
    )


SEAL_JOB = "seal_chunks"


def seal_job(ctx: AppContext, now: float) -> None:
    """Seal raw samples older than a minute into chunks (app/storage/chunk_seal.py), then keep the
    database within KVSCOPE_STORAGE_BUDGET_MB (app/storage/store_budget.py)."""
    seal_head(ctx.engine, now)
    if ctx.settings.storage.budget_mb > 0:
        apply_budget(ctx.engine, int(ctx.settings.storage.budget_mb * 1_000_000), now)
