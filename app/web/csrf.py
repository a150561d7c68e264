"""CSRF protection of the controller's forms: a signed double-submit token.

A random cookie (`kvscope_csrf`, SameSite=Strict, HttpOnly) is set on the pages with forms; each
form carries HMAC(secret_key, cookie). A POST is accepted only when both are present and match,
and when its Origin (or Referer) names this host. JSON endpoints need `Content-Type:
application/json`, which a cross-site page cannot send without a CORS preflight.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, Response

COOKIE = "kvscope_csrf"
FIELD = "csrf"


def _sign(secret: str, value: str) -> str:
    return hmac.new(secret.encode(), value.encode(), hashlib.sha256).hexdigest()


def issue(request: Request, secret: str) -> tuple[str, str | None]:
    """(the token for this browser's forms, a new cookie value to set or None)."""
    value = request.cookies.get(COOKIE)
    new = None
    if not value or len(value) > 128:
        value = new = secrets.token_urlsafe(24)
    return _sign(secret, value), new


def set_cookie(response: Response, value: str) -> None:
    response.set_cookie(COOKIE, value, httponly=True, samesite="strict", path="/")


def check(request: Request, form_token: object, secret: str) -> None:
    for header in ("origin", "referer"):
        v = request.headers.get(header)
        if v:
            if urlsplit(v).netloc != request.headers.get("host", ""):
                raise HTTPException(403, f"cross-site form post refused ({header} {v!r})")
            break
    value = request.cookies.get(COOKIE)
    if not value or not isinstance(form_token, str) or not hmac.compare_digest(_sign(secret, value), form_token):
        raise HTTPException(403, "missing or stale form token: reload the page and submit again")


def require_json(request: Request) -> None:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise HTTPException(415, "send Content-Type: application/json")


def render_page(
    ctx: Any,
    request: Request,
    name: str,
    data: dict[str, Any],
    *,
    active_nav: str,
    status: int = 200,
    template_globals: dict[str, Any] | None = None,
) -> Response:
    """Render a page that has forms: the template gets `csrf` (and `now`, `active_nav`), and the
    CSRF cookie is set when the browser had none. Shared by the controller and A/B pages."""
    templates = ctx.templates
    if template_globals:
        templates.env.globals.update(template_globals)
    token, new_cookie = issue(request, ctx.secret)
    resp: Response = templates.TemplateResponse(
        request, name, {"active_nav": active_nav, "now": ctx.now(), "csrf": token, **data}, status_code=status
    )
    if new_cookie is not None:
        set_cookie(resp, new_cookie)
    return resp
