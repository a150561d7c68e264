"""The field method: a long prefix cold, again (GPU hit), K other prefixes to evict it, again.

The last request of each repetition is tagged `reload`: with a CPU tier it is loaded back
(external_kv_transfer), without one it is recomputed. Each repetition uses fresh prefixes.
"""

from __future__ import annotations

from agent.workloads import prompts
from agent.workloads.context import RunContext


def run(ctx: RunContext) -> None:
    spec = ctx.spec
    evict_len = spec.evict_tokens or spec.prefix_tokens
    for rep in range(spec.repetitions):
        ctx.check()
        target = prompts.text(f"{ctx.run_key}-r{rep}-target", spec.prefix_tokens)
        ctx.send(target, "cold")
        ctx.check()
        ctx.send(target, "hit")
        for k in range(spec.evict_prefixes):
            ctx.check()
            ctx.send(prompts.text(f"{ctx.run_key}-r{rep}-evict{k}", evict_len), "evict")
        ctx.check()
        ctx.send(target, "reload")
