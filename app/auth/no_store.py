"""`Cache-Control: no-store` on every answer to a logged-in caller (a session or a token), so a
shared or back-button cache never keeps a page or JSON read that needed a login. /static and
anonymous answers (the login page, public dashboards) keep their caching."""

from __future__ import annotations

from typing import Any

from app.auth.roles import Principal

NO_STORE = (b"cache-control", b"no-store")


class NoStoreForLoggedIn:
    """Pure ASGI middleware; reads the principal the guard left in the request's state."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or str(scope.get("path", "")).startswith("/static/"):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})

        async def send_no_store(message: Any) -> None:
            if message["type"] == "http.response.start":
                who = state.get("principal")
                if isinstance(who, Principal) and who.kind != "anonymous":
                    headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"cache-control"]
                    message = {**message, "headers": [*headers, NO_STORE]}
            await send(message)

        await self.app(scope, receive, send_no_store)
