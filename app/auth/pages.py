"""The login page, logout, and one-time login links."""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from app.auth import sessions
from app.auth.client_addr import client_address, networks
from app.auth.limiter import LoginLimiter
from app.auth.passwords import verify_password
from app.auth.roles import PUBLIC, VIEWER, requires
from app.context import AppContext
from app.storage.sessions_store import create_session, revoke_session
from app.storage.users_store import consume_login_link, record_login, user_by_id, user_by_name
from app.web import csrf
from app.web.deps import CtxDep

MAX_NEXT_CHARS = 2000


def safe_next(value: Any) -> str:
    """A local path to go to after logging in (never another site)."""
    v = value if isinstance(value, str) else ""
    if not v.startswith("/") or v.startswith("//") or "\\" in v or len(v) > MAX_NEXT_CHARS or v.startswith("/login"):
        return "/"
    return v


def _client(ctx: AppContext, request: Request) -> str:
    return client_address(request.scope, networks(ctx.settings.auth.trusted_proxies))


def start_session(ctx: AppContext, request: Request, response: Response, user_id: int) -> None:
    """A new server-side session; the cookie carries only its random id."""
    max_age_s = ctx.settings.auth.session_max_age_h * 3600
    value = create_session(ctx.engine, user_id, ctx.now(), max_age_s)
    secure = sessions.is_secure(ctx.settings, request)
    response.set_cookie(
        sessions.cookie_name(secure, request.url.port),
        value,
        max_age=int(max_age_s),
        httponly=True,
        samesite="lax",
        secure=secure,
        path="/",
    )


def login_limiter(ctx: AppContext) -> LoginLimiter:
    """The app's one login limiter (ctx.state)."""
    return ctx.state(LoginLimiter, lambda: LoginLimiter(ctx.settings.auth.login_max_failures))


def page(ctx: AppContext, request: Request, status: int = 200, **data: Any) -> Response:
    data = {"error": "", "message": "", "name": "", "next": "/", **data}
    return csrf.render_page(ctx, request, "auth/login.html", data, active_nav="", status=status)


router = APIRouter()


@router.get("/login", response_class=HTMLResponse, include_in_schema=False)
@requires(PUBLIC)
def login_page(ctx: CtxDep, request: Request, next: str = "/") -> Response:
    return page(ctx, request, next=safe_next(next))


@router.post("/login", include_in_schema=False)
@requires(PUBLIC)
async def login(ctx: CtxDep, request: Request) -> Response:
    form = await request.form(max_files=0, max_fields=10, max_part_size=4096)
    csrf.check(request, form.get(csrf.FIELD), ctx.secret)
    name = str(form.get("name") or "")[:64]
    password = str(form.get("password") or "")
    nxt = safe_next(form.get("next"))
    now = ctx.now()
    addr, who = _client(ctx, request), name.lower()
    limiter = login_limiter(ctx)
    wait = limiter.begin(addr, who, now)  # counted before the password check
    if wait > 0:
        resp = page(ctx, request, 429, error=f"Too many failed logins: try again in {wait:.0f} s.", name=name, next=nxt)
        resp.headers["Retry-After"] = str(math.ceil(wait))
        return resp
    user = await run_in_threadpool(user_by_name, ctx.engine, name)
    ok = await run_in_threadpool(verify_password, user.password_hash if user else None, password)
    if user is None or not ok:
        limiter.failed(addr, who, now)
        return page(ctx, request, 401, error="Wrong user name or password.", name=name, next=nxt)
    limiter.succeeded(addr, who, now)
    await run_in_threadpool(record_login, ctx.engine, user.id, now)
    resp = RedirectResponse(nxt, status_code=303)
    await run_in_threadpool(start_session, ctx, request, resp, user.id)
    return resp


@router.get("/login/once", include_in_schema=False)
@requires(PUBLIC)
def login_once(ctx: CtxDep, request: Request, t: str = "") -> Response:
    """The one-time link `kvscope up` / `demo` print: logs in once, then is spent."""
    uid = consume_login_link(ctx.engine, t[:256], ctx.now())
    user = user_by_id(ctx.engine, uid) if uid is not None else None
    if user is None:
        return page(ctx, request, 401, error="This login link is used up or expired: log in with a password.")
    record_login(ctx.engine, user.id, ctx.now())
    resp = RedirectResponse("/", status_code=303)
    start_session(ctx, request, resp, user.id)
    return resp


@router.post("/logout", include_in_schema=False)
@requires(VIEWER)
def logout(ctx: CtxDep, request: Request) -> Response:
    """Viewer (a live session: a cross-site post carries no SameSite=Lax cookie, so no form token).
    Ends the session in the database too, so a copy of the cookie stops working."""
    sid = sessions.session_id_of(ctx.settings, request)
    revoke_session(ctx.engine, sid, ctx.now())
    secure = sessions.is_secure(ctx.settings, request)
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(sessions.cookie_name(secure, request.url.port), path="/", secure=secure, httponly=True)
    return resp
