"""Background jobs (APScheduler 3, in-process). Parts register jobs in their install(app, ctx);
the scheduler starts with the app (lifespan) when settings.server.run_scheduler is on.

Every job is a function of `now`, so tests call it directly instead of waiting for the scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.context import AppContext, Job, JobFunc

log = logging.getLogger("kvscope.jobs")


def register_job(ctx: AppContext, name: str, func: JobFunc, interval_s: float) -> None:
    jobs = ctx.jobs
    jobs.append(Job(name, func, interval_s))


def run_job_now(ctx: AppContext, name: str, now: float | None = None) -> None:
    """Run one registered job once (tests, CLI)."""
    for job in ctx.jobs:
        if job.name == name:
            job.func(ctx, ctx.now() if now is None else now)
            return
    raise KeyError(name)


def install(app: FastAPI, ctx: AppContext) -> None:
    previous = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        scheduler = None
        if getattr(a.state, "start_jobs", False) and ctx.jobs:
            from apscheduler.schedulers.background import BackgroundScheduler

            scheduler = BackgroundScheduler(daemon=True)
            for job in ctx.jobs:
                scheduler.add_job(
                    _guarded(ctx, job),
                    "interval",
                    seconds=job.interval_s,
                    id=job.name,
                    max_instances=1,
                    coalesce=True,
                    misfire_grace_time=max(1, int(job.interval_s)),
                )
            scheduler.start()
        try:
            async with previous(a):
                yield
        finally:
            if scheduler is not None:
                scheduler.shutdown(wait=False)

    app.router.lifespan_context = lifespan


def _guarded(ctx: AppContext, job: Job) -> Callable[[], None]:
    def run() -> None:
        try:
            job.func(ctx, ctx.now())
        except Exception:  # a failing job never kills the scheduler
            log.exception("job %s failed", job.name)

    return run
