"""Error pages for people: an unknown or malformed URL under /instances answers an HTML page in
the dashboard's frame (status code kept), never raw JSON; every piece of the message is escaped
by the template (autoescape), so a URL cannot inject markup."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse

TITLES = {400: "Bad request", 404: "Not found", 422: "Bad request"}


def html_error(request: Request, status: int, message: str) -> HTMLResponse:
    templates = request.app.state.ctx.templates
    return templates.TemplateResponse(  # type: ignore[no-any-return]
        request,
        "dashboard/error.html",
        {"status": status, "title": TITLES.get(status, "Error"), "message": message[:500]},
        status_code=status,
    )
