"""Reading a JSON request body for the JSON API routes: size capped while it streams in (413),
parse errors and nesting too deep for the parser (RecursionError: a 5,000-deep body was a 500)
answered 400 with the route's own hint. The push and command long-poll bodies have their own
readers (app/ingest/api.py, app/ingest/commands.py)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request

MAX_JSON_BODY = 1024 * 1024  # profiles, experiments, silences, ...: a few KiB each


async def read_json(request: Request, hint: str = "body is not valid JSON", max_bytes: int = MAX_JSON_BODY) -> Any:
    """The parsed body; HTTPException 413 past `max_bytes`, 400 (`hint`) when it is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise HTTPException(413, f"body over {max_bytes} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > max_bytes:
            raise HTTPException(413, f"body over {max_bytes} bytes")
    try:
        return json.loads(bytes(body))
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
        raise HTTPException(400, hint) from None
