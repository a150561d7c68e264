"""Failed-login rate limits, counted before the password check (under one lock, so parallel
attempts cannot all slip through):

- per client address: at most N attempts that have not succeeded in a sliding window;
- per user name: after N failures in a row, each next attempt waits min(2^k, cap) seconds
  (k: failures past N). The owner still gets in after the wait; nobody can renew a long lock.

Time is always passed in (`now`), so tests never sleep."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

WINDOW_S = 300.0
MAX_KEYS = 10_000
NAME_DELAY_CAP_S = 60.0


@dataclass
class _NameState:
    failures: int = 0
    last: float = 0.0
    locked_until: float = 0.0


def _bounded(d: dict[str, object]) -> None:
    if len(d) >= MAX_KEYS:  # bounded memory; a flood forgets the oldest keys
        for k in list(d)[: MAX_KEYS // 10]:
            del d[k]


class WindowLimiter:
    """At most N counted events per key in a sliding window."""

    def __init__(self, max_events: int, window_s: float = WINDOW_S) -> None:
        self.max_events = max_events
        self.window_s = window_s
        self._events: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        q = self._events.get(key)
        if q is None:
            _bounded(self._events)  # type: ignore[arg-type]
            q = self._events[key] = deque()
        while q and now - q[0] > self.window_s:
            q.popleft()
        return q

    def _wait(self, q: deque[float], now: float) -> float:
        return max(self.window_s - (now - q[0]), 0.001) if len(q) >= self.max_events else 0.0

    def retry_after(self, key: str, now: float) -> float:
        """Seconds until `key` may try again (0: now)."""
        with self._lock:
            return self._wait(self._recent(key, now), now)

    def failed(self, key: str, now: float) -> None:
        with self._lock:
            self._recent(key, now).append(now)


class LoginLimiter:
    def __init__(self, max_failures: int, window_s: float = WINDOW_S, cap_s: float = NAME_DELAY_CAP_S) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.cap_s = cap_s
        self.addresses = WindowLimiter(max_failures, window_s)
        self._names: dict[str, _NameState] = {}
        self._lock = threading.Lock()

    def begin(self, address: str, name: str, now: float) -> float:
        """Count one attempt before the password is checked. Returns 0 when it may go on (then call
        `succeeded` or `failed`), else the seconds to wait (nothing counted)."""
        with self._lock, self.addresses._lock:
            q = self.addresses._recent(address, now)
            wait = self.addresses._wait(q, now)
            st = self._names.get(name)
            if st is not None and now - st.last > self.window_s and now >= st.locked_until:
                st = None
                self._names.pop(name, None)
            if st is not None and now < st.locked_until:
                wait = max(wait, st.locked_until - now)
            if wait > 0:
                return wait
            q.append(now)  # counted now; a success takes it back
            if st is None:
                _bounded(self._names)  # type: ignore[arg-type]
                st = self._names[name] = _NameState()
            st.failures += 1
            st.last = now
            if st.failures >= self.max_failures:
                st.locked_until = now + min(2.0 ** (st.failures - self.max_failures), self.cap_s)
            return 0.0

    def failed(self, address: str, name: str, now: float) -> None:
        """The attempt `begin` let through failed: already counted."""

    def succeeded(self, address: str, name: str, now: float) -> None:
        with self._lock, self.addresses._lock:
            self._names.pop(name, None)
            q = self.addresses._recent(address, now)
            if q:
                q.pop()
