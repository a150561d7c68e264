"""No synthetic traffic: the arm serves whatever live traffic arrives for a window. Results come
from the counter snapshots and the server's histograms only."""

from __future__ import annotations

from agent.workloads.context import RunContext


def run(ctx: RunContext) -> None:
    end = ctx.t0 + ctx.spec.window_s
    while True:
        ctx.check()
        left = end - ctx.clock()
        if left <= 0:
            return
        ctx.sleep(min(left, 1.0))
