"""Replay a recorded trace: each request at its recorded offset (scaled by `speed`), at most
`concurrency` in flight. Requests without an offset go as soon as a slot is free."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from agent.workloads.context import Cancelled, RunContext


def run(ctx: RunContext) -> None:
    spec = ctx.spec

    def one(rec: dict[str, object]) -> None:
        offset = rec.get("offset_s")
        if isinstance(offset, int | float):
            wait = float(offset) / spec.speed - (ctx.clock() - ctx.t0)
            while wait > 0 and not ctx.cancelled():
                ctx.sleep(min(wait, 0.5))
                wait = float(offset) / spec.speed - (ctx.clock() - ctx.t0)
        if ctx.cancelled():
            return
        mt = rec.get("max_tokens")
        ctx.send(str(rec["prompt"]), "replay", max_tokens=int(mt) if isinstance(mt, int) else None)

    with ThreadPoolExecutor(max_workers=spec.concurrency) as pool:
        list(pool.map(one, spec.records))
    ctx.check()
    if len(ctx.results) < len(spec.records):
        raise Cancelled("cancelled")
