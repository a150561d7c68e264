"""The rules kvscope evaluates: name, what they watch, scope, default parameters.

Every rule has the common parameters `enabled`, `for_s` (how long the condition must hold before
firing), `cooldown_s` (after a resolve, how long before the same alert may open again) and
`severity`. Defaults here < settings.alerts.rules < per-instance overrides (from the UI).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.alerts import rules_health, rules_hitrate, rules_offload
from app.alerts import units as u
from app.alerts.hints import HINT_METRICS
from app.alerts.hitrates import TIER_METRICS
from app.alerts.rule_io import RuleResult, TargetData

RuleFunc = Callable[[TargetData, float, Mapping[str, Any]], RuleResult]

_HINT_PARAMS: dict[str, Any] = {
    "shift_margin": 0.5,
    "length_margin": 0.3,
    "mix_margin": 0.3,
    "hybrid_block_tokens": 256,
}


@dataclass(frozen=True)
class RuleSpec:
    name: str
    title: str
    scope: str  # "instance" | "host"
    func: RuleFunc
    defaults: Mapping[str, Any]
    metrics: tuple[str, ...] = ()  # instance (or host) series the rule reads
    description: str = ""
    units: tuple[str, str] = ("", "")  # of the value and of the baseline (app.alerts.units)

    def format(self, value: object, which: str = "value") -> str:
        return u.fmt_value(value, self.units[0 if which == "value" else 1])

    def lookback_s(self, params: Mapping[str, Any]) -> float:
        """How far back the rule reads, for the loader."""
        return max(float(params.get("baseline_s", 0.0)), float(params.get("window_s", 0.0)))


def _common(for_s: float, cooldown_s: float, severity: str = "warning", enabled: bool = True) -> dict[str, Any]:
    return {"enabled": enabled, "for_s": for_s, "cooldown_s": cooldown_s, "severity": severity}


def _drop(tier: str, title: str, description: str) -> RuleSpec:
    return RuleSpec(
        name=f"hit_rate_drop_{tier}",
        title=title,
        scope="instance",
        func=rules_hitrate.make_hit_rate_drop(tier),
        defaults={
            **_common(for_s=120.0, cooldown_s=600.0),
            "window_s": 300.0,
            "baseline_s": 86400.0,
            "abs_margin": 0.10,
            "rel_margin": 0.25,
            "min_tokens": 5000.0,
            "min_baseline_tokens": 50000.0,
            "min_history_s": 3600.0,  # a baseline from less history than this is still learning
            **_HINT_PARAMS,
        },
        metrics=TIER_METRICS[tier] + TIER_METRICS["overall"] + HINT_METRICS,
        description=description,
        units=(u.RATIO, u.RATIO),
    )


RULES: tuple[RuleSpec, ...] = (
    _drop(
        "overall",
        "Prefix hit rate drop",
        "Share of prompt tokens served from a cache (GPU or offload tier) fell below its trailing baseline.",
    ),
    _drop(
        "gpu", "GPU prefix-cache hit rate drop", "vllm:prefix_cache_hits / queries fell below its trailing baseline."
    ),
    _drop(
        "offload",
        "Offload-tier hit rate drop",
        "vllm:external_prefix_cache_hits / queries fell below its trailing baseline (only with a tier in use).",
    ),
    RuleSpec(
        name="hit_rate_floor",
        title="Prefix hit rate under floor",
        scope="instance",
        func=rules_hitrate.hit_rate_floor,
        defaults={
            **_common(for_s=300.0, cooldown_s=600.0, enabled=False),
            "window_s": 300.0,
            "floor": 0.2,
            "min_tokens": 5000.0,
            "baseline_s": 86400.0,
            **_HINT_PARAMS,
        },
        metrics=TIER_METRICS["overall"] + HINT_METRICS,
        description="Overall hit rate below an absolute floor. Off by default: the right floor depends on "
        "the workload.",
        units=(u.RATIO, u.RATIO),
    ),
    RuleSpec(
        name="instance_down",
        title="vLLM instance down or unhealthy",
        scope="instance",
        func=rules_health.instance_down,
        defaults={
            **_common(for_s=0.0, cooldown_s=60.0, severity="critical"),
            "down_after_s": 60.0,
            "agent_stale_s": 120.0,
        },
        description="No successful /metrics scrape for down_after_s, or /health failing.",
        units=(u.SECONDS, u.SECONDS),
    ),
    RuleSpec(
        name="agent_stale",
        title="Agent stale",
        scope="host",
        func=rules_health.agent_stale,
        defaults={**_common(for_s=0.0, cooldown_s=60.0, severity="critical"), "stale_after_s": 120.0},
        description="The host's agent has not pushed for stale_after_s.",
        units=(u.SECONDS, u.SECONDS),
    ),
    RuleSpec(
        name="pinned_memory",
        title="Pinned memory near the limit",
        scope="host",
        func=rules_health.pinned_memory,
        defaults={
            **_common(for_s=60.0, cooldown_s=600.0, severity="critical"),
            "min_headroom_gib": 2.0,
            "min_headroom_ratio": 0.05,
            "max_age_s": 120.0,
        },
        metrics=rules_health.MEMORY_METRICS,
        description="Host memory headroom (MemAvailable, cgroup limit - usage) under a threshold with offload on: "
        "the pinned CPU buffer counts against the limit and the OOM killer leaves no hint.",
        units=(u.BYTES, u.BYTES),
    ),
    RuleSpec(
        name="offload_thrash",
        title="Offload thrash",
        scope="instance",
        func=rules_offload.offload_thrash,
        defaults={
            **_common(for_s=300.0, cooldown_s=1800.0),
            "window_s": 600.0,
            "min_store_gib": 1.0,
            "max_load_ratio": 0.02,
        },
        metrics=(rules_offload.STORE_BYTES, rules_offload.LOAD_BYTES),
        description="Stores to the offload tier keep flowing while loads stay near zero.",
        units=(u.RATIO, u.RATIO),
    ),
    RuleSpec(
        name="offload_failures",
        title="Offload allocation failures / skipped stores",
        scope="instance",
        func=rules_offload.offload_failures,
        defaults={
            **_common(for_s=0.0, cooldown_s=900.0),
            "window_s": 300.0,
            "baseline_s": 3600.0,
            "min_alloc_failures": 1.0,
            "min_skipped": 100.0,
            "skipped_factor": 3.0,
        },
        metrics=(rules_offload.ALLOC_FAILURES, rules_offload.STORES_SKIPPED),
        description="vllm:kv_offload_allocation_failure_total rising, or stores skipped well above their baseline.",
        units=(u.COUNT, u.PER_SECOND),
    ),
    RuleSpec(
        name="ttft_p95",
        title="TTFT p95 over budget",
        scope="instance",
        func=rules_offload.ttft_p95,
        defaults={
            **_common(for_s=300.0, cooldown_s=900.0),
            "window_s": 300.0,
            "quantile": 0.95,
            "budget_s": 0.0,  # 0: relative to the instance's own trailing TTFT (factor x); > 0: fixed
            "factor": 2.0,
            "min_budget_s": 0.5,
            "baseline_s": 86400.0,
            "min_history_s": 3600.0,
            "min_requests": 20.0,
        },
        metrics=(rules_offload.TTFT_BUCKET, rules_offload.TTFT_COUNT),
        description="Time to first token quantile over budget for a sustained period: the rollback signal. "
        "The budget is factor x the instance's own trailing quantile unless budget_s sets a fixed one.",
        units=(u.LATENCY, u.LATENCY),
    ),
)

BY_NAME: dict[str, RuleSpec] = {r.name: r for r in RULES}
HIT_RATE_RULES = frozenset({"hit_rate_drop_overall", "hit_rate_drop_gpu", "hit_rate_drop_offload", "hit_rate_floor"})
