"""The FastAPI application factory. Everything is built from the settings passed in."""

from __future__ import annotations

import html
import logging
import time
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import Engine
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.gzip import GZipMiddleware

from app.ab.api import install as install_ab
from app.alerts.api import checked_rules
from app.alerts.api import install as install_alerts
from app.auth import guard
from app.auth.install import install as install_auth
from app.auth.secret import effective_secret
from app.context import AppContext, Clock, Part
from app.controller.api import install as install_controller
from app.dashboard import install as install_dashboard
from app.export.api import install as install_prometheus_source
from app.export.exporter import install as install_exporter
from app.ingest.api import install as install_ingest
from app.selfmetrics import SelfMetrics
from app.settings import Settings
from app.sizing import install as install_sizing
from app.storage.engine import open_database
from app.storage.ingest_store import IngestWriter
from app.web import jobs
from app.web.docs import install_docs
from app.web.errors import page_error_for_http, page_error_for_validation
from app.web.templating import make_templates
from kvscope import __version__

log = logging.getLogger("kvscope.app")

# The parts this app mounts, in this order. A part is `install(app, ctx)` (app.context.Part): it
# adds its routers to the app and its jobs, push hooks, command providers and template globals to
# the context. An import error here is an error: no part is optional.
PARTS: tuple[Part, ...] = (
    install_ingest,  # POST /api/v1/ingest (agents' pushes), /api/v1/commands (long-poll)
    install_dashboard,  # pages, fragments, JSON reads, static assets, the rollup job
    install_controller,  # profiles, rollouts
    install_alerts,  # rules, evaluation and delivery jobs, pages, API
    install_ab,  # A/B experiments
    install_exporter,  # derived per-instance series on /metrics (scale-out)
    install_prometheus_source,  # /api/v1/prometheus/...: charts read from a Prometheus (scale-out)
    install_sizing,  # cache sizing from KV events: /instances/{id}/sizing
)


def check_settings(settings: Settings) -> None:
    """What the parts check of the settings beyond their shape (raises UserError): run before the
    database is opened, so a bad setting stops the app before any migration has run."""
    checked_rules(settings)


def create_app(
    settings: Settings, *, engine: Engine | None = None, clock: Clock = time.time, start_jobs: bool | None = None
) -> FastAPI:
    check_settings(settings)
    engine = engine or open_database(settings.effective_database_url)
    ctx = AppContext(
        settings=settings,
        engine=engine,
        writer=IngestWriter(engine),
        metrics=SelfMetrics(),
        clock=clock,
        secret=effective_secret(settings),
        templates=make_templates(),
    )
    # Every route runs the role check first (app/auth): each states its role with @requires
    # (tests/app/web/test_every_route.py fails on one that does not).
    app = FastAPI(
        title="kvscope",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(guard.dependency(ctx))],
    )
    app.state.ctx = ctx
    app.state.start_jobs = settings.server.run_scheduler if start_jobs is None else start_jobs
    _install_errors(app)
    _install_timing(app, ctx)
    install_docs(app)
    for part in PARTS:
        part(app, ctx)
    install_auth(app, ctx)  # login pages, admin API, Host allow-list and security headers (outermost)
    jobs.install(app, ctx)  # last: starts whatever jobs the parts registered
    return app


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(req: Request, exc: RequestValidationError) -> Response:
        page = page_error_for_validation(req, exc.errors())
        if page is not None:
            return page
        parts = []
        for err in exc.errors()[:5]:
            loc = ".".join(str(p) for p in err.get("loc", ()))
            parts.append(f"{loc}: {err.get('msg')}")
        return JSONResponse({"error": "invalid request: " + "; ".join(parts)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> Response:
        page = page_error_for_http(req, exc.status_code, str(exc.detail))
        if page is not None:
            return page
        accept = req.headers.get("accept", "")
        if "text/html" in accept and not req.url.path.startswith("/api/") and exc.status_code in (403, 404, 405):
            from fastapi.responses import HTMLResponse

            detail = html.escape(str(exc.detail))  # the detail may quote the path: never raw HTML
            return HTMLResponse(
                f"<!doctype html><title>{exc.status_code}</title><p>{exc.status_code}: {detail}</p>"
                "<p><a href='/'>kvscope overview</a></p>",
                status_code=exc.status_code,
            )
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse({"error": "internal error; see the kvscope log"}, status_code=500)


class _Timing:
    """Request duration per route into /metrics; plain ASGI (no BaseHTTPMiddleware stream wrapping)."""

    def __init__(self, app: Any, ctx: AppContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = getattr(scope.get("route"), "path", "unmatched")
            self.ctx.metrics.request_seconds.labels(path, f"{status // 100}xx").observe(time.perf_counter() - t0)


def _install_timing(app: FastAPI, ctx: AppContext) -> None:
    app.add_middleware(_Timing, ctx=ctx)
    app.add_middleware(GZipMiddleware, minimum_size=1000, compresslevel=6)  # every text response


__all__ = ["HTTPException", "create_app"]
