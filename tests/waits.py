"""Waiting on a condition instead of sleeping a fixed time: the one `wait_until` the tests use
when a real process or thread has to reach a state (a server answering, a file rewritten, a
count of hosts seen). The timeout is a bound on a stuck process, never a timing assertion."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    pred: Callable[[], T],
    what: str,
    timeout: float = 30.0,
    interval: float = 0.05,
    *,
    abort: Callable[[], str | None] | None = None,
) -> T:
    """Call `pred` until it returns something truthy and return that; AssertionError naming `what`
    (and the last exception `pred` raised, if any) when `timeout` seconds pass first. `abort`
    (optional) is asked before each try: a message from it (a process died, a thread ended) fails
    at once instead of waiting out the timeout."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        if abort is not None and (why_not := abort()):
            raise AssertionError(f"gave up waiting for {what}: {why_not}")
        try:
            got = pred()
        except Exception as exc:  # a server not up yet, a file half-written: try again
            last_exc = exc
        else:
            if got:
                return got
        if time.monotonic() >= deadline:
            why = f" (last error: {last_exc!r})" if last_exc is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{why}")
        time.sleep(interval)


async def wait_until_async(pred: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.02) -> T:
    """`wait_until` inside an event loop: yields to the loop between tries, so a task the test
    waits on (a callback scheduled after a reply went out) gets to run."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)
