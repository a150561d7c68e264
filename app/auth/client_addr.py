"""The client address a request's limits count against: the peer, or, when the peer is a trusted
proxy (KVSCOPE_TRUSTED_PROXIES), the right-most X-Forwarded-For address that is not a trusted proxy.
An X-Forwarded-For from anyone else is ignored (it is only a claim)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_HOPS = 32


def networks(proxies: Iterable[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(p.strip(), strict=False) for p in proxies if p.strip())


def _trusted(addr: str, trusted: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return any(ip in n for n in trusted)


def client_address(scope: Any, trusted: tuple[Network, ...]) -> str:
    client = scope.get("client")
    peer = str(client[0]) if client else "unknown"
    if not trusted or not _trusted(peer, trusted):
        return peer
    hops: list[str] = []
    for k, v in scope.get("headers", ()):
        if k == b"x-forwarded-for":
            hops += [h.strip() for h in v.decode("latin-1").split(",")]
    hops = [h for h in hops if h][-MAX_HOPS:]
    for hop in reversed(hops):
        if not _trusted(hop, trusted):
            return hop[:64]
    return hops[0][:64] if hops else peer
