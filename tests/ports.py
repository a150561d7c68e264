"""The one free-port probe every test that starts a server uses (simulators, rigs, PostgreSQL,
Prometheus, Alertmanager, real vLLM). A port found free may be taken before the server binds it:
callers that can retry do."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at this instant, on `host` (loopback by default)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
