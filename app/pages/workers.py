"""Page work runs a few threads at a time, so agents' pushes never queue behind charts.

Under the GIL every runnable thread slows every other one: forty chart computations in the
default thread pool make a 5 ms push take seconds. Pages and fragments therefore go through a
limiter of `page_threads` threads; requests beyond it wait without holding a thread or the GIL,
and pushes, the long-poll and /healthz keep the rest of the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio.to_thread
from anyio import CapacityLimiter

from app.context import AppContext

T = TypeVar("T")


async def run_page_work(ctx: AppContext, fn: Callable[[], T]) -> T:
    limiter = ctx.extras.get("page_limiter")
    if limiter is None:  # created on first use, inside the event loop
        limiter = ctx.extras.setdefault("page_limiter", CapacityLimiter(ctx.settings.page_threads))
    return await anyio.to_thread.run_sync(fn, limiter=limiter)
