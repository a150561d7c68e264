"""Offload-tier rules: thrash (stores without loads), allocation failures / skipped stores, and the
latency rollback signal (TTFT p95 over budget). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.alerts.rule_io import RuleResult, TargetData
from app.alerts.series import bucket_increases, window_increase
from app.derived.evaluate import histogram_quantile

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
    """TTFT quantile over the window above the budget (with a minimum of requests)."""
    start = now - float(p["window_s"])
    count = window_increase(data.series.get(TTFT_COUNT), start, now).value
    if count is None or count < float(p["min_requests"]):
        return RuleResult(None, message="too few requests to judge TTFT")
    q = float(p["quantile"])
    buckets: dict[float, float | None] = dict(bucket_increases(data.series.get(TTFT_BUCKET), start, now))
    value = histogram_quantile(q, buckets)
    if value is None:
        return RuleResult(None, message="no TTFT histogram")
    budget = float(p["budget_s"])
    msg = f"TTFT p{q * 100:.0f} {value * 1000:.0f} ms over {count:.0f} requests (budget {budget * 1000:.0f} ms)"
    return RuleResult(value > budget, value, budget, msg)
