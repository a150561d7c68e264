"""Hit-rate rules: a drop below the trailing baseline (per tier) and an absolute floor. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from app.alerts import expected
from app.alerts.hints import hit_rate_hints, offload_configured
from app.alerts.hitrates import EXT_QUERIES, TIER_METRICS, hit_rate
from app.alerts.rule_io import Hint, RuleResult, TargetData
from app.alerts.series import window_increase

Rule = Callable[[TargetData, float, Mapping[str, Any]], RuleResult]

TIER_LABEL = {"overall": "overall", "gpu": "GPU prefix-cache", "offload": "offload-tier"}


def _human(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _offload_in_use(data: TargetData, start: float, end: float) -> bool:
    """The instance has an offload tier now: configured, or external lookups in [start, end]
    (a tier the baseline had but the instance no longer runs does not count)."""
    q = window_increase(data.series.get(EXT_QUERIES), start, end).value
    return (q is not None and q > 0) or offload_configured(data.info)


def _first_sample(data: TargetData, tier: str) -> float | None:
    firsts = [s.points[0][0] for name in TIER_METRICS[tier] for s in data.series.get(name) if s.points]
    return min(firsts) if firsts else None


def baseline_span(data: TargetData, tier: str, now: float, window_s: float, baseline_s: float) -> tuple[float, float]:
    """The baseline window (app.alerts.expected.baseline_window) of a tier's hit rate."""
    return expected.baseline_window(data.info, _first_sample(data, tier), now, window_s, baseline_s)


def make_hit_rate_drop(tier: str) -> Rule:
    """Hit rate over the short window below the trailing baseline of the same metric by BOTH an
    absolute and a relative margin, with enough prompt tokens in both windows."""

    def rule(data: TargetData, now: float, p: Mapping[str, Any]) -> RuleResult:
        window_s = float(p["window_s"])
        baseline_s = float(p["baseline_s"])
        start = now - window_s
        label = TIER_LABEL[tier]
        if tier == "offload" and not _offload_in_use(data, start, now):
            return RuleResult(False, message="no offload tier on this instance now: nothing to judge")
        change = expected.covering(expected.from_info(data.info), now)
        if change is not None and change.end is None:
            return RuleResult(None, message=f"expected: {change.label} is changing this instance")
        b0, b1 = baseline_span(data, tier, now, window_s, baseline_s)
        need = min(float(p.get("min_history_s", 3600.0)), baseline_s - window_s)
        if b1 - b0 < need:
            had = max(0.0, b1 - b0)
            return RuleResult(
                None,
                message=f"learning: the {label} baseline has {_human(had)} of history, it needs {_human(need)} "
                f"(of the trailing {_human(baseline_s)}) before this rule judges",
            )
        cur = hit_rate(data.series, tier, start, now)
        base = hit_rate(data.series, tier, b0, b1)
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
        span = "the trailing " + _human(baseline_s) if b1 - b0 >= baseline_s - 1 else f"the {_human(b1 - b0)} before"
        msg = (
            f"{label} hit rate {cur.rate:.1%} over the last {_human(window_s)} vs {base.rate:.1%} "
            f"over {span} (alert below {max(threshold, 0):.1%})"
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
