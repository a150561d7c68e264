"""The app's edge, before routing: the Host allow-list (a web page cannot drive the app through
DNS rebinding) and the security headers on every response."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable
from typing import Any

from app.settings import Settings

CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",  # Plotly and htmx set inline styles; scripts stay 'self' only
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


def default_allowed_hosts(settings: Settings) -> set[str]:
    hosts = {"localhost", "127.0.0.1", "::1", settings.server.host.lower()}
    if not settings.is_loopback:
        hosts |= _machine_names()
    return hosts


def _machine_names() -> set[str]:
    names: set[str] = set()
    try:
        name = socket.gethostname()
        names |= {name.lower(), socket.getfqdn().lower()}
        for info in socket.getaddrinfo(name, None):
            names.add(str(info[4][0]).lower())
    except OSError:
        pass
    return {n for n in names if n}


def host_of(header: str) -> str:
    """The host part of a Host header: 'a:8080' -> 'a', '[::1]:8080' -> '::1'."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class Perimeter:
    """Pure ASGI middleware: 400 for a Host outside the allow-list, security headers on every answer."""

    def __init__(self, app: Any, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = {a.strip().lower() for a in allowed}
        self.any_host = "*" in self.allowed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = ""
        for k, v in scope.get("headers", ()):
            if k == b"host":
                host = v.decode("latin-1")
                break
        if not self.any_host and host_of(host) not in self.allowed:
            await _refuse(send, host)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _refuse(send: Any, host: str) -> None:
    body = json.dumps(
        {
            "error": f"Host {host[:100]!r} is not allowed: add it to KVSCOPE_ALLOWED_HOSTS "
            "(a guard against DNS rebinding)"
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
