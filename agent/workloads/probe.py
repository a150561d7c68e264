"""The field method: a long prefix cold, again (GPU hit), K other prefixes to evict it, again.

The last request of each repetition is tagged `reload`: with a CPU tier it is loaded back
(external_kv_transfer), without one it is recomputed. Each repetition uses fresh prefixes.

The evicting volume is sized from the server's real capacities (`plan_probe`): just over the GPU
pool (cache_config_info), so the probed prefix leaves the GPU, and no more than the offload tier
can hold next to it, so a tier that could keep it still has it when it is asked again.
"""

from __future__ import annotations

import math
from typing import Any

from agent.workloads import prompts
from agent.workloads.context import RunContext
from agent.workloads.spec import WorkloadSpec

DEFAULT_EVICT = 2  # when the pool size is unknown (the field's laptop probe: B and C)
MIN_PROMPT = 16


def evict_count(pool_tokens: int | None, evict_len: int) -> int:
    """Enough other prefixes to push the probed one out of the GPU pool: their tokens fill the pool.
    (Not more: with a CPU tier the probed prefix must still be in it when asked again.)"""
    if not pool_tokens or pool_tokens <= 0:
        return DEFAULT_EVICT
    return max(1, math.ceil(pool_tokens / evict_len))


def plan_probe(
    spec: WorkloadSpec,
    pool_tokens: int | None,
    tiers: list[dict[str, Any]],
    *,
    block_tokens: int = 16,
    max_model_len: int | None = None,
) -> dict[str, Any]:
    """How many evicting prefixes of how many tokens, and why, in words (`text`).

    Evicting volume E = the GPU pool + one block (cut into prefixes no longer than the probed one,
    or than max_model_len allows), so the probed prefix (T tokens, the oldest) leaves the GPU pool.
    An LRU offload tier of C tokens stores the probed prefix and then every evicting one: it still
    holds the probed prefix when T + E <= C. A tier smaller than that cannot be probed this way,
    and the plan says so (`feasible` False)."""
    t = spec.prefix_tokens
    base = spec.evict_tokens or t
    if max_model_len:
        base = max(MIN_PROMPT, min(base, max_model_len - spec.max_tokens - 1))
    plan: dict[str, Any] = {"pool_tokens": pool_tokens, "prefix_tokens": t, "tiers": tiers, "feasible": True}
    sized = [x for x in tiers if isinstance(x.get("tokens"), int)]
    tier_words = (
        "; ".join(f"{x['name']} tier {x['tokens']:,} tokens" if x.get("tokens") else f"{x['name']} tier" for x in tiers)
        or "no offload tier"
    )
    if spec.evict_prefixes is not None:
        n, length = spec.evict_prefixes, base
        plan["text"] = f"{n} evicting prefixes of {length:,} tokens, set by hand (not sized; {tier_words})"
    elif not pool_tokens or pool_tokens <= 0:
        n, length = DEFAULT_EVICT, base
        plan["text"] = f"GPU pool size unknown (no cache_config_info): {n} evicting prefixes of {length:,} tokens"
    else:
        target = pool_tokens + max(1, block_tokens)
        n = max(1, math.ceil(target / base))
        length = max(MIN_PROMPT, math.ceil(target / n))
        plan["text"] = (
            f"sized against the GPU pool ({pool_tokens:,} tokens) and {tier_words}: "
            f"{n} evicting prefixes of {length:,} tokens ({n * length:,} tokens) push the {t:,}-token "
            "probed prefix out of the GPU pool"
        )
        for x in sized:
            need = t + n * length
            if need > x["tokens"]:
                plan["feasible"] = False
                plan["text"] += (
                    f"; NOT POSSIBLE for the {x['name']} tier: it holds {x['tokens']:,} tokens, less than the "
                    f"probed prefix plus what evicts it from the GPU pool ({need:,}), so it loses the probed "
                    "prefix too and the reloads will mostly recompute (a bigger tier, or a smaller GPU pool, "
                    "can be probed)"
                )
            else:
                plan["text"] += f"; the {x['name']} tier keeps it ({need:,} of {x['tokens']:,} tokens used)"
    plan["evict_prefixes"] = n
    plan["evict_tokens"] = length
    return plan


def run(ctx: RunContext) -> None:
    spec = ctx.spec
    plan = plan_probe(spec, ctx.pool_tokens, ctx.tiers, block_tokens=ctx.block_tokens, max_model_len=ctx.max_model_len)
    n_evict, evict_len = int(plan["evict_prefixes"]), int(plan["evict_tokens"])
    ctx.notes["evict_prefixes"] = n_evict
    ctx.notes["evict_tokens"] = evict_len
    ctx.notes["pool_tokens"] = ctx.pool_tokens
    ctx.notes["plan"] = plan
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
