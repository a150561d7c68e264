"""Error pages for people: a page route (an HTML GET outside /api/, a whole page or an htmx
fragment) that meets an unknown or
malformed URL answers an HTML page in the dashboard's frame (status code kept), never raw JSON;
every piece of the message is escaped by the template (autoescape), so a URL cannot inject markup.

The routes themselves stay typed (`DbId`, `RangeQueryDep`): FastAPI's parameter check fails them,
and the app's error handlers (app/main.py) ask `page_error_for_validation` / `page_error_for_http`
here for the page, falling back to the JSON error every other route answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute

TITLES = {400: "Bad request", 404: "Not found", 422: "Bad request"}
MAX_SHOWN_INPUT = 40  # characters of a rejected value quoted back (escaped by the template)
MAX_SHOWN_ERRORS = 3
PAGE_STATUSES = frozenset({400, 404, 409, 422})  # refusals a page shows in its frame


def html_error(request: Request, status: int, message: str) -> HTMLResponse:
    templates = request.app.state.ctx.templates
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request,
        "dashboard/error.html",
        {"status": status, "title": TITLES.get(status, "Error"), "message": message[:500]},
        status_code=status,
    )


def page_route(request: Request) -> APIRoute | None:
    """The route that matched, when it is a page: a GET declared to answer HTML, outside /api/."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or request.method != "GET" or request.url.path.startswith("/api/"):
        return None
    return route if route.response_class is HTMLResponse else None


def _descriptions(route: APIRoute) -> dict[str, str]:
    """Each path and query parameter's declared description, through the route's dependencies."""
    out: dict[str, str] = {}
    todo = [route.dependant]
    while todo:
        dep = todo.pop()
        for field in [*dep.path_params, *dep.query_params]:
            if field.field_info.description:
                out[field.alias] = field.field_info.description
        todo.extend(dep.dependencies)
    return out


def _describe(err: dict[str, Any], descriptions: dict[str, str]) -> str:
    loc = tuple(err.get("loc") or ())
    where, name = (str(loc[0]), str(loc[-1])) if len(loc) >= 2 else ("", "request")
    shown = str(err.get("input", ""))[:MAX_SHOWN_INPUT]
    if where == "path":
        what = name.removesuffix("_id")
        return f"no {what} {shown!r}: {descriptions.get(name, 'not a valid id')}; see the overview"
    about = f" ({descriptions[name]})" if name in descriptions else ""
    return f"{name}{about}: {err.get('msg', 'invalid')}, not {shown!r}"


def page_error_for_validation(request: Request, errors: Sequence[Any]) -> HTMLResponse | None:
    """The HTML page for a page route's failed parameter check: 404 when the path names nothing
    (a malformed id), 422 for a bad query as everywhere; None for every other route (JSON)."""
    route = page_route(request)
    if route is None:
        return None
    descriptions = _descriptions(route)
    in_path = any((e.get("loc") or ("",))[0] == "path" for e in errors)
    message = "; ".join(_describe(e, descriptions) for e in list(errors)[:MAX_SHOWN_ERRORS])
    return html_error(request, 404 if in_path else 422, message)


def page_error_for_http(request: Request, status: int, detail: str) -> HTMLResponse | None:
    """The HTML page for an HTTPException a page route raised (its 404 for an unknown id, a 400
    for a bad range); None for every other route, and for 401/403 (the login flow answers those)."""
    if page_route(request) is None or status not in PAGE_STATUSES:
        return None
    return html_error(request, status, detail)
