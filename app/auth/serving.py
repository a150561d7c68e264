"""How uvicorn serves the app: timeouts so slow or idle connections do not stay open.

uvicorn has no deadline for a request's headers, so the h11 protocol here closes a connection
whose request line and headers have not all arrived HEADER_TIMEOUT_S after it opened (or after its
previous response). The body's deadline is app.auth.bodylimit's (KVSCOPE_BODY_TIMEOUT_S, 408)."""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5
MAX_HEADER_BYTES = 64 * 1024


class DeadlineH11Protocol(H11Protocol):
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        self._header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self.header_deadline_passed)

    def header_deadline_passed(self) -> None:
        """Close unless a request's headers have all arrived (h11 leaves IDLE only then)."""
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def uvicorn_options(trusted_proxies: list[str]) -> dict[str, Any]:
    """Keyword arguments for uvicorn.run / uvicorn.Config besides app, host, port and logging.
    X-Forwarded-For/-Proto are believed only from KVSCOPE_TRUSTED_PROXIES (uvicorn's default
    trusts 127.0.0.1, so anyone reaching a loopback proxy could pick their address)."""
    return {
        "proxy_headers": bool(trusted_proxies),
        "forwarded_allow_ips": [p.strip() for p in trusted_proxies] or None,
        "http": DeadlineH11Protocol,
        "timeout_keep_alive": KEEP_ALIVE_S,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
        "timeout_graceful_shutdown": 3,
    }
