"""The field method: a long prefix cold, again (GPU hit), K other prefixes to evict it, again.

The last request of each repetition is tagged `reload`: with a CPU tier it is loaded back
(external_kv_transfer), without one it is recomputed. Each repetition uses fresh prefixes.
"""

from __future__ import annotations

import math

from agent.workloads import prompts
from agent.workloads.context import RunContext

DEFAULT_EVICT = 2  # when the pool size is unknown (the field's laptop probe: B and C)


def evict_count(pool_tokens: int | None, evict_len: int) -> int:
    """Enough other prefixes to push the probed one out of the GPU pool: their tokens fill the pool.
    (Not more: with a CPU tier the probed prefix must still be in it when asked again.)"""
    if not pool_tokens or pool_tokens <= 0:
        return DEFAULT_EVICT
    return max(1, math.ceil(pool_tokens / evict_len))


def run(ctx: RunContext) -> None:
    spec = ctx.spec
    evict_len = spec.evict_tokens or spec.prefix_tokens
    n_evict = spec.evict_prefixes if spec.evict_prefixes is not None else evict_count(ctx.pool_tokens, evict_len)
    ctx.notes["evict_prefixes"] = n_evict
    ctx.notes["pool_tokens"] = ctx.pool_tokens
    for rep in range(spec.repetitions):
        ctx.check()
        target = prompts.text(f"{ctx.run_key}-r{rep}-target", spec.prefix_tokens)
        ctx.send(target, "cold")
        ctx.check()
        ctx.send(target, "hit")
        for k in range(n_evict):
            ctx.check()
            ctx.send(prompts.text(f"{ctx.run_key}-r{rep}-evict{k}", evict_len), "evict")
        ctx.check()
        ctx.send(target, "reload")
