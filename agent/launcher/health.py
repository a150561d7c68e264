"""Wait until a server answers /health 200 and lists a model on /v1/models, within a deadline.

Clock and sleep are arguments, so tests drive time by hand; a dead process ends the wait at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx


@dataclass
class HealthResult:
    ok: bool
    reason: str
    elapsed_s: float
    model: str | None = None
    model_root: str | None = None


def wait_healthy(
    url: str,
    deadline_s: float,
    *,
    alive: Callable[[], bool | None] = lambda: None,
    client: httpx.Client | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 0.05,
    request_timeout_s: float = 5.0,
) -> HealthResult:
    own = client is None
    c = client or httpx.Client(timeout=request_timeout_s)
    base = url.rstrip("/")
    t0 = clock()
    last = "no answer yet"
    try:
        while True:
            if alive() is False:
                return HealthResult(False, f"process exited before healthy ({last})", clock() - t0)
            try:
                r = c.get(base + "/health", timeout=request_timeout_s)
                if r.status_code == 200:
                    m = c.get(base + "/v1/models", timeout=request_timeout_s)
                    if m.status_code == 200:
                        data = m.json().get("data") or []
                        if data and isinstance(data[0], dict):
                            return HealthResult(
                                True,
                                "healthy",
                                clock() - t0,
                                model=str(data[0].get("id")) if data[0].get("id") else None,
                                model_root=str(data[0].get("root")) if data[0].get("root") else None,
                            )
                        last = "/v1/models lists no model"
                    else:
                        last = f"/v1/models answered {m.status_code}"
                else:
                    last = f"/health answered {r.status_code}"
            except (httpx.HTTPError, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"[:200]
            if clock() - t0 >= deadline_s:
                return HealthResult(False, f"not healthy within {deadline_s:.0f} s ({last})", clock() - t0)
            sleep(poll_s)
    finally:
        if own:
            c.close()
