"""Hit-rate rules: a drop below the trailing baseline (per tier) and an absolute floor. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from app.alerts.hints import hit_rate_hints, offload_configured
from app.alerts.hitrates import EXT_QUERIES, hit_rate
from app.alerts.rule_io import Hint, RuleResult, TargetData
from app.alerts.series import window_increase

Rule = Callable[[TargetData, float, Mapping[str, Any]], RuleResult]

TIER_LABEL = {"overall": "overall", "gpu": "GPU prefix-cache", "offload": "offload-tier"}


def _human(seconds: float) -> str:
    if seconds % 3600 == 0 and seconds >= 3600:
        return f"{seconds / 3600:.0f} h"
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _offload_in_use(data: TargetData, start: float, end: float) -> bool:
    q = window_increase(data.series.get(EXT_QUERIES), start, end).value
    return (q is not None and q > 0) or offload_configured(data.info)


def make_hit_rate_drop(tier: str) -> Rule:
    """Hit rate over the short window below the trailing baseline of the same metric by BOTH an
    absolute and a relative margin, with enough prompt tokens in both windows."""

    def rule(data: TargetData, now: float, p: Mapping[str, Any]) -> RuleResult:
        window_s = float(p["window_s"])
        start = now - window_s
        b0, b1 = now - float(p["baseline_s"]), start
        if tier == "offload" and not _offload_in_use(data, b0, now):
            return RuleResult(False, message="no offload tier in use")
        cur = hit_rate(data.series, tier, start, now)
        base = hit_rate(data.series, tier, b0, b1)
        label = TIER_LABEL[tier]
        if cur.volume is None or cur.volume < float(p["min_tokens"]) or cur.rate is None:
            vol = 0.0 if cur.volume is None else cur.volume
            return RuleResult(
                None,
                cur.rate,
                base.rate,
                f"too few tokens for a {label} hit rate: {vol:.0f} < {float(p['min_tokens']):.0f}",
            )
        if base.volume is None or base.volume < float(p["min_baseline_tokens"]) or base.rate is None:
            return RuleResult(None, cur.rate, base.rate, f"no {label} baseline yet (too little history)")
        threshold = min(base.rate - float(p["abs_margin"]), base.rate * (1.0 - float(p["rel_margin"])))
        active = cur.rate < threshold
        msg = (
            f"{label} hit rate {cur.rate:.1%} over the last {_human(window_s)} vs {base.rate:.1%} "
            f"over the trailing {_human(float(p['baseline_s']))} (alert below {max(threshold, 0):.1%})"
        )
        hints: tuple[Hint, ...] = ()
        if active:
            hints = hit_rate_hints(
                data,
                window=(start, now),
                baseline=(b0, b1),
                current=cur.rate,
                baseline_rate=base.rate,
                resets=cur.resets,
                params=p,
            )
        return RuleResult(active, cur.rate, base.rate, msg, hints)

    return rule


def hit_rate_floor(data: TargetData, now: float, p: Mapping[str, Any]) -> RuleResult:
    """Overall hit rate over the window below an absolute floor (off by default: workload-specific)."""
    window_s = float(p["window_s"])
    start = now - window_s
    cur = hit_rate(data.series, "overall", start, now)
    if cur.volume is None or cur.volume < float(p["min_tokens"]) or cur.rate is None:
        return RuleResult(None, cur.rate, None, "too few prompt tokens to judge")
    floor = float(p["floor"])
    active = cur.rate < floor
    msg = f"overall hit rate {cur.rate:.1%} over the last {_human(window_s)} (floor {floor:.1%})"
    hints: tuple[Hint, ...] = ()
    if active:
        b0, b1 = now - float(p["baseline_s"]), start
        base = hit_rate(data.series, "overall", b0, b1)
        hints = hit_rate_hints(
            data,
            window=(start, now),
            baseline=(b0, b1),
            current=cur.rate,
            baseline_rate=base.rate,
            resets=cur.resets,
            params=p,
        )
    return RuleResult(active, cur.rate, floor, msg, hints)
