"""Helpers to drive the simulator in tests: engine to completion with explicit time, ASGI clients."""

from __future__ import annotations

import itertools
from typing import Any

import httpx

from simulator.config import config_from_argv
from simulator.engine import Engine, SimRequest
from simulator.server import SimApp

_ids = itertools.count()


def doc_text(i: int, n: int) -> str:
    """A document of exactly n tokens for the simulator's tokenizer (one token per word)."""
    return " ".join(f"d{i}w{j}" for j in range(n))


def doc_ids(i: int, n: int) -> list[int]:
    return [(i * 100_003 + j * 7_919) % 150_000 for j in range(n)]


def engine(*argv: str, now: float = 0.0) -> Engine:
    return Engine(config_from_argv(list(argv)), now)


def run(e: Engine, ids: list[int], max_tokens: int = 16, at: float | None = None) -> SimRequest:
    """Submit one request at `at` (default: 1 s after the engine's clock) and advance until it ends."""
    t = e.t + 1.0 if at is None else at
    r = e.submit(f"r{next(_ids)}", ids, max_tokens, t)
    while r.finished_at is None and r.error is None:
        nt = e.next_event_time()
        if nt is None:
            break
        e.advance(nt)
    return r


def settle(e: Engine) -> None:
    while (nt := e.next_event_time()) is not None:
        e.advance(nt)


def app(*argv: str, time_scale: float = 1000.0, dev_mode: bool = True, **kw: Any) -> SimApp:
    import time

    return SimApp(
        Engine(config_from_argv(list(argv)), time.monotonic()), time_scale=time_scale, dev_mode=dev_mode, **kw
    )


def client(a: SimApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://sim", timeout=30)
