"""Every route of the app with the role it needs: what the security tests sweep and
`docs/security.md` lists."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from fastapi.routing import APIRoute

from app.auth.roles import role_needed


def _walk(routes: Iterable[Any], prefix: str) -> Iterator[tuple[str, APIRoute]]:
    for r in routes:
        if isinstance(r, APIRoute):
            yield prefix + r.path, r
        inner = getattr(r, "original_router", None)  # FastAPI >= 0.16x: included routers stay nested
        if inner is not None:
            ctx = getattr(r, "include_context", None)
            yield from _walk(inner.routes, prefix + str(getattr(ctx, "prefix", "") or ""))


def role_table(app: Any) -> list[tuple[str, str, str]]:
    """(method, path, role) for every API route, sorted by path."""
    out = []
    for path, route in _walk(app.routes, ""):
        for method in sorted(route.methods or ()):
            if method != "HEAD":
                out.append((method, path, role_needed(route.endpoint, method)))
    return sorted(set(out), key=lambda t: (t[1], t[0]))
