"""Agent authentication: Bearer tokens, checked against hashes with a short in-memory cache."""

from __future__ import annotations

import hmac
import threading

from fastapi import HTTPException, Request

from app.context import AppContext
from app.storage.tokens import hash_token, lookup_token

CACHE_TTL_S = 30.0


class TokenChecker:
    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self._cache: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def check(self, request: Request) -> str:
        """Return the token's name, or raise 401."""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <agent token>'")
        static = self.ctx.settings.agent_token
        if static and hmac.compare_digest(static.encode(), token.encode()):
            return "static"
        now = self.ctx.now()
        h = hash_token(token)
        with self._lock:
            hit = self._cache.get(h)
        if hit is not None and now - hit[1] < CACHE_TTL_S:
            return hit[0]
        name = lookup_token(self.ctx.engine, token)
        if name is None:
            raise HTTPException(401, "unknown or revoked agent token")
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[h] = (name, now)
        return name
