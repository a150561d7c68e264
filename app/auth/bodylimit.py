"""Request bodies, before any route reads one: the role check first (an anonymous upload is refused
before a byte of it is read), then a size cap (413 on a Content-Length over it, and a chunked body
stops being read past it) and a deadline (408 when the body has not arrived in time)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

from app.auth import guard
from app.context import AppContext

INGEST_PATH = "/api/v1/ingest"  # has its own, larger cap (max_batch_bytes, app/ingest/api.py)


async def _answer(send: Any, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"error": message}).encode()
    hs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    hs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if status in (408, 413):
        hs.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": body})


def _has_body(scope: Any) -> tuple[bool, int | None]:
    declared: int | None = None
    chunked = False
    for k, v in scope.get("headers", ()):
        if k == b"content-length":
            try:
                declared = int(v)
            except ValueError:
                declared = -1
        elif k == b"transfer-encoding" and b"chunked" in v.lower():
            chunked = True
    return chunked or bool(declared), declared


class BodyLimit:
    """Pure ASGI middleware (inside the Perimeter)."""

    def __init__(self, app: Any, ctx: AppContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.ctx = ctx
        self.clock = clock

    def cap_for(self, path: str) -> int:
        s = self.ctx.settings
        own = s.auth.max_body_bytes
        return max(s.ingest.max_batch_bytes, own) if path == INGEST_PATH else own

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        has_body, declared = _has_body(scope)
        if not has_body:
            await self.app(scope, receive, send)
            return
        if declared == -1:
            await _answer(send, 400, "bad Content-Length header")
            return
        cap = self.cap_for(scope.get("path", ""))
        if declared is not None and declared > cap:
            await _answer(send, 413, f"request body of {declared} bytes over the {cap}-byte cap")
            return
        deadline = self.clock() + self.ctx.settings.auth.body_timeout_s
        seen = 0
        started = False
        answered = False
        checked = False
        body_done = False

        async def refuse(status: int, message: str, headers: dict[str, str] | None = None) -> Any:
            # Answer here (FastAPI turns an error raised while it reads a body into a 400), then tell
            # the app the client left; whatever the app sends after this is dropped.
            nonlocal answered
            if not started and not answered:
                answered = True
                await _answer(send, status, message, headers)
            return {"type": "http.disconnect"}

        async def limited_receive() -> Any:
            nonlocal seen, checked, body_done
            if answered:
                return {"type": "http.disconnect"}
            if body_done:  # after the body: a long-poll waits here for the client to hang up
                return await receive()
            if not checked:  # the route is known now (scope["route"]), no byte of the body read yet
                checked = True
                refusal = await self._authorize(scope)
                if refusal is not None:
                    return await refuse(refusal.status_code, str(refusal.detail), dict(refusal.headers or {}))
            left = deadline - self.clock()
            try:
                if left <= 0:
                    raise TimeoutError
                message = await asyncio.wait_for(receive(), timeout=left)
            except TimeoutError:
                timeout = self.ctx.settings.auth.body_timeout_s
                return await refuse(408, f"request body not received within {timeout:g} s")
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    return await refuse(413, f"request body over the {cap}-byte cap")
                body_done = not message.get("more_body", False)
            return message

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if answered:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, guarded_send)

    async def _authorize(self, scope: Any) -> HTTPException | None:
        """The route's role check, before the body is read (FastAPI reads a body before it runs
        its dependencies). The app-wide dependency checks again once the route runs."""
        request = Request(scope)
        try:
            await run_in_threadpool(guard.authorize, self.ctx, request, guard.needed_role(self.ctx, request))
        except HTTPException as exc:
            return exc
        except guard.LoginRequired:
            return HTTPException(401, "log in (/login) first")
        return None
