"""Failed-login rate limit: at most N failures per client address and per user name in a window."""

from __future__ import annotations

import threading
from collections import deque

WINDOW_S = 300.0
MAX_KEYS = 10_000


class LoginLimiter:
    def __init__(self, max_failures: int, window_s: float = WINDOW_S) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._fails: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        q = self._fails.get(key)
        if q is None:
            if len(self._fails) >= MAX_KEYS:  # bounded memory; a flood forgets the oldest keys
                for k in list(self._fails)[: MAX_KEYS // 10]:
                    del self._fails[k]
            q = self._fails[key] = deque()
        while q and now - q[0] > self.window_s:
            q.popleft()
        return q

    def retry_after(self, keys: tuple[str, ...], now: float) -> float:
        """Seconds until a login may be tried again for these keys (0: now)."""
        with self._lock:
            waits = [
                self.window_s - (now - q[0])
                for q in (self._recent(k, now) for k in keys)
                if len(q) >= self.max_failures
            ]
        return max(waits, default=0.0)

    def failed(self, keys: tuple[str, ...], now: float) -> None:
        with self._lock:
            for k in keys:
                self._recent(k, now).append(now)

    def succeeded(self, keys: tuple[str, ...]) -> None:
        with self._lock:
            for k in keys[1:]:  # the user name's count; the address keeps its failures
                self._fails.pop(k, None)
