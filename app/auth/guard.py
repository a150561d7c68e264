"""Who is asking, and may they: resolves the principal of a request (bearer token or session
cookie) and enforces the role its route needs. Tokens and sessions are read from the database on
every request, so a revoked token or a deleted user stops at once."""

from __future__ import annotations

import hmac
import math
from typing import Any

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

from app.auth import sessions
from app.auth.client_addr import client_address, networks
from app.auth.limiter import WindowLimiter
from app.auth.roles import AGENT, ANONYMOUS, PUBLIC, VIEWER, Principal, role_needed
from app.context import AppContext
from app.storage.sessions_store import session_user_id
from app.storage.tokens import lookup_token, touch_token
from app.storage.users_store import user_by_id

PUBLIC_METRICS_PATHS = ("/metrics",)


class LoginRequired(Exception):
    """An anonymous browser asked for a page: send it to the login page."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class BearerLimiter(WindowLimiter):
    """Failed bearer tokens per client address (the app's one instance: ctx.state)."""


def bearer_limiter(ctx: AppContext) -> BearerLimiter:
    return ctx.state(BearerLimiter, lambda: BearerLimiter(ctx.settings.auth.bearer_max_failures))


def resolve(ctx: AppContext, request: Request) -> Principal:
    """The principal of a request: its bearer token, else its session cookie, else anonymous."""
    token = bearer(request)
    if token is not None:
        limiter = bearer_limiter(ctx)
        addr = client_address(request.scope, networks(ctx.settings.auth.trusted_proxies))
        now = ctx.now()
        wait = limiter.retry_after(addr, now)
        if wait > 0:
            raise HTTPException(
                429,
                f"too many failed bearer tokens: try again in {math.ceil(wait)} s",
                headers={"Retry-After": str(math.ceil(wait))},
            )
        static = ctx.settings.auth.agent_token
        if static and hmac.compare_digest(static.encode(), token.encode()):
            return Principal(kind="agent", name="static", role=AGENT, host=ctx.settings.auth.agent_token_host)
        info = lookup_token(ctx.engine, token)
        if info is None:
            limiter.failed(addr, now)
            raise HTTPException(401, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"})
        if info.role == AGENT:
            return Principal(kind="agent", name=info.name, role=AGENT, host=info.host)
        return Principal(kind="token", name=info.name, role=info.role)
    uid = session_user_id(ctx.engine, sessions.session_id_of(ctx.settings, request), ctx.now())
    if uid is not None:
        user = user_by_id(ctx.engine, uid)
        if user is not None:
            return Principal(kind="user", name=user.name, role=user.role, user_id=user.id)
    return ANONYMOUS


def _wants_html(request: Request) -> bool:
    return (
        request.method in ("GET", "HEAD")
        and not request.url.path.startswith("/api/")
        and ("text/html" in request.headers.get("accept", ""))
    )


def needed_role(ctx: AppContext, request: Request) -> str:
    route = request.scope.get("route")
    need = role_needed(getattr(route, "endpoint", None), request.method)
    if need == VIEWER and ctx.settings.auth.metrics_public and request.url.path in PUBLIC_METRICS_PATHS:
        return PUBLIC
    return need


def authorize(ctx: AppContext, request: Request, need: str) -> Principal:
    """The request's principal when it may use a route that needs `need`; raises otherwise."""
    if need == PUBLIC:
        request.state.principal = ANONYMOUS
        return ANONYMOUS
    who = resolve(ctx, request)
    if who.kind == "anonymous" and need == VIEWER and ctx.settings.auth.public_dashboards:
        who = Principal(kind="anonymous", name="public", role=VIEWER)  # KVSCOPE_PUBLIC_DASHBOARDS: reads only
        request.state.principal = who
        return who
    if who.kind == "anonymous":
        if need != AGENT and _wants_html(request):
            raise LoginRequired(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        if need == AGENT:
            raise HTTPException(
                401, "missing bearer token: send 'Authorization: Bearer <agent token>'", {"WWW-Authenticate": "Bearer"}
            )
        raise HTTPException(
            401, "log in (/login) or send 'Authorization: Bearer <API token>'", {"WWW-Authenticate": "Bearer"}
        )
    if not who.has(need):
        if need == AGENT:
            raise HTTPException(403, "this endpoint is for agents: use an agent token (`kvscope token create HOST`)")
        if who.kind == "agent":
            raise HTTPException(403, "an agent token may only push and poll for its own host")
        raise HTTPException(403, f"this needs the {need} role; {who.label} has {who.role or 'none'}")
    request.state.principal = who
    return who


TOUCH_EVERY_S = 60.0  # last_used is written at most this often per token


def dependency(ctx: AppContext) -> Any:
    """The app-wide FastAPI dependency: runs before every route's handler (and before it reads a body)."""
    touched: dict[str, float] = {}

    def check_and_touch(request: Request, need: str) -> None:
        who = authorize(ctx, request, need)
        if who.kind in ("agent", "token") and who.name != "static":
            now = ctx.now()
            if now - touched.get(who.name, -1e18) >= TOUCH_EVERY_S:
                if len(touched) > 10_000:
                    touched.clear()
                touched[who.name] = now
                touch_token(ctx.engine, who.name, now)

    async def check(request: Request) -> None:
        await run_in_threadpool(check_and_touch, request, needed_role(ctx, request))

    return check


def agent_host_check(request: Request, host: str) -> None:
    """403 unless the request's agent token may speak for `host`."""
    who = getattr(request.state, "principal", None)
    if not isinstance(who, Principal) or who.kind != "agent":
        raise HTTPException(403, "this endpoint is for agents")
    if who.host is not None and who.host != host:
        raise HTTPException(
            403, f"token {who.name!r} is bound to host {who.host!r} and may not speak for host {host!r}"
        )
