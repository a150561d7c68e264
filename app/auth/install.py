"""Wires the auth part into the app: login pages, the admin API, the login redirect, the perimeter.

The role check itself is an app-wide dependency that create_app passes to FastAPI (guard.dependency),
so it runs for every route, whichever part adds it."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse

from app.auth import admin_api, pages
from app.auth.bodylimit import BodyLimit
from app.auth.guard import LoginRequired
from app.auth.no_store import NoStoreForLoggedIn
from app.auth.perimeter import Perimeter, default_allowed_hosts
from app.context import AppContext


def install(app: FastAPI, ctx: AppContext) -> None:
    app.include_router(pages.router)
    app.include_router(admin_api.router)

    @app.exception_handler(LoginRequired)
    async def _to_login(_req: Request, exc: LoginRequired) -> RedirectResponse:
        return RedirectResponse("/login?next=" + quote(exc.next_path, safe="/"), status_code=303)

    app.add_middleware(BodyLimit, ctx=ctx)  # role check and caps before a body is read
    app.add_middleware(NoStoreForLoggedIn)
    allowed = set(ctx.settings.auth.allowed_hosts) or default_allowed_hosts(ctx.settings)
    app.add_middleware(Perimeter, allowed=allowed)  # added last: the outermost layer
