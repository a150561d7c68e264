"""Page work runs a few threads at a time, so agents' pushes never queue behind charts.

Under the GIL every runnable thread slows every other one: forty chart computations in the
default thread pool make a 5 ms push take seconds. Pages and fragments therefore go through a
limiter of PAGE_THREADS threads; requests beyond it wait without holding a thread or the GIL,
and pushes, the long-poll and /healthz keep the rest of the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio.to_thread
from anyio import CapacityLimiter

from app.context import AppContext

T = TypeVar("T")
# Threads computing pages at once: two keep a page and its fragments moving while leaving the
# interpreter to the pushes; more only slow each chart (the GIL) and queue pushes behind them
PAGE_THREADS = 2


async def run_page_work(ctx: AppContext, fn: Callable[[], T]) -> T:
    # created on first use, inside the event loop
    pages = ctx.state(PageThreads, lambda: PageThreads(CapacityLimiter(PAGE_THREADS)))
    return await anyio.to_thread.run_sync(fn, limiter=pages.limiter)


@dataclass(frozen=True)
class PageThreads:
    """The dashboard's limit on threads doing page work at once (AppContext.state)."""

    limiter: CapacityLimiter
