"""Every route of the app with the role it needs: what the security tests sweep and
`docs/security.md` lists. Routes are read from the app object itself (its routers, included
routers and mounts), never from a hand-kept list."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from fastapi.routing import APIRoute
from starlette.routing import Mount

from app.auth.roles import declared_role, role_needed


def _walk(routes: Iterable[Any], prefix: str) -> Iterator[tuple[str, str, Any]]:
    """(method, path, endpoint) of every route under `routes`; a mount (/static) is one GET."""
    for r in routes:
        if isinstance(r, APIRoute):
            for method in sorted(r.methods or ()):
                if method != "HEAD":
                    yield method, prefix + r.path, r.endpoint
        elif isinstance(r, Mount):
            yield "GET", prefix + r.path + "/{path}", r.app
        inner = getattr(r, "original_router", None)  # FastAPI >= 0.16x: included routers stay nested
        if inner is not None:
            ctx = getattr(r, "include_context", None)
            yield from _walk(inner.routes, prefix + str(getattr(ctx, "prefix", "") or ""))


def role_table(app: Any) -> list[tuple[str, str, str]]:
    """(method, path, role) for every route, sorted by path."""
    out = {(method, path, role_needed(endpoint, method)) for method, path, endpoint in _walk(app.routes, "")}
    return sorted(out, key=lambda t: (t[1], t[0]))


def undeclared_routes(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route that does not state its role with @requires."""
    out = {(method, path) for method, path, endpoint in _walk(app.routes, "") if declared_role(endpoint) is None}
    return sorted(out, key=lambda t: (t[1], t[0]))


def endpoints(app: Any) -> list[tuple[str, str, Any]]:
    """(method, path, endpoint) of every route (a mount's endpoint is the app it mounts)."""
    return sorted(_walk(app.routes, ""), key=lambda t: (t[1], t[0]))
