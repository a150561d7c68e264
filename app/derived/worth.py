"""'Is offload worth it?': over the selected range, what the offload tier (CPU, disk, LMCache,
another connector) gave back and what it cost, from the counters' increases over the range.

Prefill speed (what recomputing costs) = recomputed tokens / prefill seconds, where the prefill
seconds are vLLM's request_prefill_time_seconds; a build without that histogram gets an estimate,
said so in the verdict: TTFT - queue time, else TTFT alone (includes queueing: a lower bound on
the speed). Saved = reloaded tokens / prefill speed - load seconds (where the connector exports
its transfer time; else the load time is inside the prefill time and the saving is an upper
bound, said so too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.derived.panels import TIER_FAMILIES, Scope, offload_size_bytes, scope_connector, tiers_from
from kvcore import kv_vocabulary as kv

PREFILL_SUM = "vllm:request_prefill_time_seconds_sum"
QUEUE_SUM = "vllm:request_queue_time_seconds_sum"
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
NAMES = [
    kv.BY_SOURCE,
    kv.LOAD_BYTES,
    kv.LOAD_TIME,
    kv.STORE_BYTES,
    kv.STORE_TIME,
    PREFILL_SUM,
    QUEUE_SUM,
    TTFT_SUM,
]
PREFILL_MEASURED = "measured"
PREFILL_FROM_TTFT_QUEUE = "estimated from TTFT - queue time"
PREFILL_FROM_TTFT = "estimated from TTFT (includes queueing)"

Increase = tuple[Mapping[str, Any], float]


@dataclass
class Worth:
    offload_configured: bool  # the instance has an offload tier (configured or seen reloading)
    tier: str | None  # what it is: CPU, disk, LMCache, external connector, ...
    reloaded_tokens: float | None
    recomputed_tokens: float | None
    gpu_hit_tokens: float | None
    load_bytes: float | None
    load_seconds: float | None
    store_bytes: float | None
    load_gbps: float | None  # per worker, while transferring (not the chart's average over time)
    load_tokens_per_s: float | None
    prefill_tokens_per_s: float | None  # recomputed tokens / prefill seconds
    prefill_basis: str | None  # measured | estimated ... (None: no prefill speed)
    saved_seconds: float | None
    thrash_ratio: float | None  # share of stored bytes never loaded back
    verdict: str
    tone: str  # good | bad | neutral


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def _sum(incs: Sequence[Increase], source: str | None = None) -> float | None:
    vals = [v for labels, v in incs if source is None or labels.get("source") == source]
    return sum(vals) if vals else None


def prefill_seconds(got: Mapping[str, Sequence[Increase]]) -> tuple[float | None, str | None]:
    """Prefill seconds over the range and how they were obtained (the one fallback order)."""
    measured = _sum(got.get(PREFILL_SUM, []))
    if measured is not None and measured > 0:
        return measured, PREFILL_MEASURED
    ttft = _sum(got.get(TTFT_SUM, []))
    if ttft is None or ttft <= 0:
        return measured, PREFILL_MEASURED if measured is not None else None
    queue = _sum(got.get(QUEUE_SUM, []))
    if queue is not None and 0 <= queue < ttft:
        return ttft - queue, PREFILL_FROM_TTFT_QUEUE
    return ttft, PREFILL_FROM_TTFT


def worth_from(got: Mapping[str, Sequence[Increase]], tiers: Sequence[str], configured_size: bool) -> Worth:
    """The worth figures from the counters' increases over one range (`got`: family name ->
    (labels, increase) per series), the instance's offload tiers and whether a CPU size is set."""
    by = got.get(kv.BY_SOURCE, [])
    reloaded = _sum(by, kv.OFFLOAD_RELOAD.vllm_label)
    recomputed = _sum(by, kv.RECOMPUTE.vllm_label)
    gpu_hit = _sum(by, kv.GPU_HIT.vllm_label)
    load_b = _sum(got.get(kv.LOAD_BYTES, []))
    load_t = _sum(got.get(kv.LOAD_TIME, []))
    store_b = _sum(got.get(kv.STORE_BYTES, []))
    prefill_s, basis = prefill_seconds(got)
    tier = kv.tier_name(tiers)
    configured = configured_size or bool(tiers) or load_b is not None or bool(reloaded)
    if configured and tier is None:
        tier = "offload tier"
    bps = _div(load_b, load_t)
    load_gbps = bps / 1e9 if bps is not None else None
    load_tps = _div(reloaded, load_t)
    prefill_tps = _div(recomputed, prefill_s)
    if prefill_tps is None:
        basis = None
    saved: float | None = None
    if reloaded is not None and prefill_tps is not None:
        saved = reloaded / prefill_tps - (load_t or 0.0)
    thrash = None
    if store_b is not None and store_b > 0:
        thrash = max(0.0, store_b - (load_b or 0.0)) / store_b
    verdict, tone = _verdict(
        configured, tier, reloaded, saved, thrash, store_b, load_tps, prefill_tps, basis, load_t is not None
    )
    return Worth(
        configured,
        tier,
        reloaded,
        recomputed,
        gpu_hit,
        load_b,
        load_t,
        store_b,
        load_gbps,
        load_tps,
        prefill_tps,
        basis,
        saved,
        thrash,
        verdict,
        tone,
    )


def compute_worth(scope: Scope) -> Worth:
    """The worth figures over the scope's range (the same code as the summary's worth)."""
    g = scope.grid
    got = scope.range_increases([*NAMES, *TIER_FAMILIES], g.start, g.end)
    tiers = tiers_from(scope.instance.get("cache_config"), got, scope_connector(scope))
    return worth_from(got, tiers, offload_size_bytes(scope.instance) is not None)


def _verdict(
    configured: bool,
    tier: str | None,
    reloaded: float | None,
    saved: float | None,
    thrash: float | None,
    stored: float | None,
    load_tps: float | None,
    prefill_tps: float | None,
    basis: str | None,
    load_time_known: bool,
) -> tuple[str, str]:
    if not configured:
        return (
            "Offload is off on this instance (no CPU offload size, no connector reloads): nothing to weigh.",
            "neutral",
        )
    name = tier or "offload tier"
    how = "" if basis in (None, PREFILL_MEASURED) else f" (prefill speed {basis})"
    if not reloaded:
        if stored:
            what = "RAM" if "CPU" in name else "storage"
            return (
                f"Not earning its {what} here: {stored / 1e9:.2f} GB stored to {name}, "
                "no token reloaded in this range.",
                "bad",
            )
        return f"No {name} reloads in this range: no verdict yet.", "neutral"
    if load_tps is not None and prefill_tps is not None and load_tps < prefill_tps:
        return (
            f"Costs more than it saves: reloading from {name} ran at {load_tps:,.0f} tok/s, slower than "
            f"recomputing ({prefill_tps:,.0f} tok/s){how}.",
            "bad",
        )
    if saved is not None and saved > 0:
        extra = f", {thrash:.0%} of stored bytes never came back" if thrash is not None else ""
        bound = "" if load_time_known else " at most"
        return (
            f"Worth it: {name} reloads of {reloaded:,.0f} tokens saved{bound} about {saved:,.1f} s of prefill "
            f"at {prefill_tps or 0:,.0f} tok/s{how}{extra}.",
            "good",
        )
    if saved is not None:
        return f"Not worth it in this range: {name} reloads did not save prefill time{how}.", "bad"
    return (
        f"Reloaded {reloaded:,.0f} tokens from {name}; no prefill timing (no prefill histogram, no TTFT, "
        "no recomputed tokens) in this range, so the time saved cannot be estimated.",
        "neutral",
    )
