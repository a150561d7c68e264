"""Offload-tier rules: thrash (stores without loads), allocation failures / skipped stores, and the
latency rollback signal (TTFT p95 over budget). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.alerts import expected
from app.alerts.rule_io import RuleResult, TargetData
from app.alerts.series import bucket_increases, window_increase
from kvcore.series import histogram_quantile

STORE_BYTES = "vllm:kv_offload_store_bytes_total"
LOAD_BYTES = "vllm:kv_offload_load_bytes_total"
ALLOC_FAILURES = "vllm:kv_offload_allocation_failure_total"
STORES_SKIPPED = "vllm:kv_offload_stores_skipped_total"
TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
GIB = 1024**3


def offload_thrash(data: TargetData, now: float, p: Mapping[str, Any]) -> RuleResult:
    """GPU->CPU stores keep flowing while CPU->GPU loads stay near zero: the tier costs PCIe
    bandwidth and pinned RAM and gives nothing back."""
    start = now - float(p["window_s"])
    stored = window_increase(data.series.get(STORE_BYTES), start, now).value
    if stored is None:
        return RuleResult(None, message="no offload store counters")
    loaded = window_increase(data.series.get(LOAD_BYTES), start, now).value or 0.0
    min_store = float(p["min_store_gib"]) * GIB
    ratio = loaded / stored if stored > 0 else None
    msg = f"stored {stored / GIB:.2f} GiB, loaded back {loaded / GIB:.2f} GiB in the window"
    if stored < min_store or ratio is None:
        return RuleResult(False, ratio, None, msg)
    return RuleResult(
        ratio < float(p["max_load_ratio"]),
        ratio,
        None,
        msg + f" (load/store {ratio:.1%}): the tier is written but not read",
    )


def offload_failures(data: TargetData, now: float, p: Mapping[str, Any]) -> RuleResult:
    """Store allocation failures in the window, or skipped stores rising well above their baseline."""
    start = now - float(p["window_s"])
    fails = window_increase(data.series.get(ALLOC_FAILURES), start, now).value
    skipped = window_increase(data.series.get(STORES_SKIPPED), start, now)
    if fails is None and skipped.value is None:
        return RuleResult(None, message="no offload failure counters")
    parts: list[str] = []
    active = False
    if fails is not None and fails >= float(p["min_alloc_failures"]):
        active = True
        parts.append(f"{fails:.0f} store allocation failure(s): the CPU buffer is full")
    base_rate = None
    if skipped.value is not None and skipped.covered_s > 0:
        b0, b1 = now - float(p["baseline_s"]), start
        base = window_increase(data.series.get(STORES_SKIPPED), b0, b1)
        now_rate = skipped.value / skipped.covered_s
        base_rate = base.value / base.covered_s if base.value is not None and base.covered_s > 0 else None
        rising = skipped.value >= float(p["min_skipped"]) and (
            base_rate is None or base_rate == 0 or now_rate > float(p["skipped_factor"]) * base_rate
        )
        if rising:
            active = True
            parts.append(
                f"{skipped.value:.0f} stores skipped ({now_rate:.2f}/s"
                + (f" vs {base_rate:.2f}/s before)" if base_rate is not None else ")")
            )
    return RuleResult(active, fails, base_rate, "; ".join(parts) or "no failures")


def ttft_p95(data: TargetData, now: float, p: Mapping[str, Any]) -> RuleResult:
    """TTFT quantile over the window above the budget (with a minimum of requests).

    budget_s > 0 is a fixed budget (an SLO the operator set). budget_s = 0 (the default) is
    relative: `factor` x the instance's own quantile over its trailing baseline (at least
    min_budget_s), learned like the hit-rate baselines. A fixed 2 s for every model fired on the
    demo's hybrid server six minutes in, every time: its normal TTFT p95 is 4-9 s (every prompt
    is a full prefill: prefixes shorter than its 2,096-token attention block never hit)."""
    window_s = float(p["window_s"])
    start = now - window_s
    count = window_increase(data.series.get(TTFT_COUNT), start, now).value
    if count is None or count < float(p["min_requests"]):
        return RuleResult(None, message="too few requests to judge TTFT")
    q = float(p["quantile"])
    value = _quantile(data, q, start, now)
    if value is None:
        return RuleResult(None, message="no TTFT histogram")
    head = f"TTFT p{q * 100:.0f} {value * 1000:.0f} ms over {count:.0f} requests"
    budget = float(p["budget_s"])
    if budget > 0:
        return RuleResult(value > budget, value, budget, f"{head} (budget {budget * 1000:.0f} ms)")
    change = expected.covering(expected.from_info(data.info), now)
    if change is not None and change.end is None:
        return RuleResult(None, value, None, f"expected: {change.label} is changing this instance")
    baseline_s = float(p["baseline_s"])
    firsts = [s.points[0][0] for s in data.series.get(TTFT_COUNT) if s.points]
    b0, b1 = expected.baseline_window(data.info, min(firsts) if firsts else None, now, window_s, baseline_s)
    need = min(float(p["min_history_s"]), baseline_s - window_s)
    if b1 - b0 < need:
        return RuleResult(
            None,
            value,
            None,
            f"{head}; learning: {max(0.0, b1 - b0) / 60:.0f} min of TTFT history, the budget needs "
            f"{need / 60:.0f} min (or set budget_s)",
        )
    base_count = window_increase(data.series.get(TTFT_COUNT), b0, b1).value
    base = _quantile(data, q, b0, b1)
    if base is None or base_count is None or base_count < float(p["min_requests"]):
        return RuleResult(None, value, None, f"{head}; too few requests in the baseline to set a budget")
    factor = float(p["factor"])
    budget = max(factor * base, float(p["min_budget_s"]))
    msg = f"{head} (budget {budget * 1000:.0f} ms = {factor:g} x its p{q * 100:.0f} of {base * 1000:.0f} ms before)"
    return RuleResult(value > budget, value, budget, msg)


def _quantile(data: TargetData, q: float, start: float, end: float) -> float | None:
    buckets: dict[float, float | None] = dict(bucket_increases(data.series.get(TTFT_BUCKET), start, end))
    return histogram_quantile(q, buckets)
