"""/api/docs (Swagger UI, served from static/vendor so it works offline) and /api/openapi.json.

Both need a viewer. The page has no inline script (the Content-Security-Policy allows scripts from
/static only): static/js/api-docs.js starts Swagger UI."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse

from app.auth.roles import VIEWER, requires

PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>kvscope API</title>
  <link rel="icon" href="data:,">
  <link rel="stylesheet" href="/static/vendor/swagger-ui/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui" data-openapi-url="/api/openapi.json"></div>
  <script src="/static/vendor/swagger-ui/swagger-ui-bundle.js"></script>
  <script src="/static/js/api-docs.js"></script>
</body>
</html>
"""


router = APIRouter(include_in_schema=False)


@router.get("/api/openapi.json")
@requires(VIEWER)
def openapi_json(request: Request) -> JSONResponse:
    schema: dict[str, Any] = request.app.openapi()
    return JSONResponse(schema)


@router.get("/api/docs")
@requires(VIEWER)
def docs() -> HTMLResponse:
    return HTMLResponse(PAGE)


def install_docs(app: FastAPI) -> None:
    app.include_router(router)
