"""Likely causes of a hit-rate drop, computed from what the app already stores. Pure.

Each check compares the alert window (start, end] with the baseline window before it:
- restart:          a counter reset in the window, or a restart / counter_reset event;
- config_change:    a config_change event (cache_config_info labels moved) near the window;
- workload_shift:   request rate, mean prompt length or the prompt-length mix (histogram buckets,
                    total variation distance) moved by more than a margin, or (when
                    nothing else explains it) the same token volume finds far fewer cached prefixes;
- hybrid_block_size: cache_config says a large block size (hybrid / mamba models hit only at
                    whole attention blocks) larger than the typical shared prefix;
- offload_saturated: vllm:kv_offload_allocation_failure_total rose in the window;
- connector_silent: the connector was asked (external queries) but answered no hits, while it
                    used to (or offload is configured), and prompts still share prefixes (the GPU
                    hit rate held at least half its baseline).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from app.alerts.hitrates import BY_SOURCE, CACHED_SOURCES, EXT_HITS, EXT_QUERIES, PROMPT_TOKENS, hit_rate
from app.alerts.rule_io import Hint, TargetData
from app.alerts.series import bucket_increases, window_increase

PROMPT_LEN_SUM = "vllm:request_prompt_tokens_sum"
PROMPT_LEN_COUNT = "vllm:request_prompt_tokens_count"
PROMPT_LEN_BUCKET = "vllm:request_prompt_tokens_bucket"
REQUEST_SUCCESS = "vllm:request_success_total"
ALLOC_FAILURES = "vllm:kv_offload_allocation_failure_total"
RESTART_EVENTS = frozenset({"restart", "counter_reset"})

HINT_METRICS = (
    PROMPT_LEN_SUM,
    PROMPT_LEN_COUNT,
    PROMPT_LEN_BUCKET,
    REQUEST_SUCCESS,
    ALLOC_FAILURES,
    EXT_HITS,
    EXT_QUERIES,
)


def _config_value(info: Mapping[str, Any], key: str) -> str | None:
    cfg = info.get("cache_config") or {}
    v = cfg.get(key) if isinstance(cfg, Mapping) else None
    return None if v is None else str(v)


def offload_configured(info: Mapping[str, Any]) -> bool:
    size = _config_value(info, "kv_offloading_size")
    if size not in (None, "", "None", "0", "0.0"):
        return True
    off = info.get("offload_config") or {}
    return bool(off)


def _rate(data: TargetData, name: str, start: float, end: float) -> float | None:
    w = window_increase(data.series.get(name), start, end)
    if w.value is None or w.covered_s <= 0:
        return None
    return w.value / w.covered_s


def _requests(data: TargetData, start: float, end: float) -> tuple[float | None, float | None]:
    """(requests per second, mean prompt tokens per request) over the window."""
    count = window_increase(data.series.get(PROMPT_LEN_COUNT), start, end)
    if count.value is None:
        count = window_increase(data.series.get(REQUEST_SUCCESS), start, end)
    tokens = window_increase(data.series.get(PROMPT_LEN_SUM), start, end)
    if tokens.value is None:
        tokens = window_increase(data.series.get(PROMPT_TOKENS), start, end)
    rps = count.value / count.covered_s if count.value is not None and count.covered_s > 0 else None
    mean_len = tokens.value / count.value if tokens.value is not None and count.value else None
    return rps, mean_len


def length_mix(data: TargetData, start: float, end: float) -> dict[float, float] | None:
    """Share of requests per prompt-length bucket (upper bound -> share) over the window, from the
    vllm:request_prompt_tokens histogram; None without requests."""
    cumulative = bucket_increases(data.series.get(PROMPT_LEN_BUCKET), start, end)
    if not cumulative:
        return None
    les = sorted(cumulative)
    counts: list[float] = []
    running = 0.0
    for le in les:
        c = max(cumulative[le], running)  # cumulative buckets never decrease
        counts.append(c - running)
        running = c
    if running <= 0:
        return None
    return {le: c / running for le, c in zip(les, counts, strict=True)}


def _mix_shift(before: dict[float, float], after: dict[float, float]) -> tuple[float, str]:
    """Total variation distance between two bucket distributions, and the bucket that moved most."""
    les = sorted(set(before) | set(after))
    diffs = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in les}
    tv = 0.5 * sum(abs(d) for d in diffs.values())
    le = max(diffs, key=lambda k: abs(diffs[k]))
    prev = les[les.index(le) - 1] if les.index(le) > 0 else 0.0
    span = f"over {prev:.0f}" if math.isinf(le) else f"{prev:.0f}-{le:.0f}"
    return tv, f"prompts of {span} tokens {before.get(le, 0.0):.0%} -> {after.get(le, 0.0):.0%} of requests"


def _moved(before: float | None, after: float | None, margin: float) -> bool:
    if before is None or after is None:
        return False
    if before <= 0:
        return after > 0
    return abs(after - before) / before > margin


def _pct(before: float, after: float) -> str:
    if before <= 0:
        return "new"
    return f"{(after - before) / before * 100:+.0f}%"


def hit_rate_hints(
    data: TargetData,
    *,
    window: tuple[float, float],
    baseline: tuple[float, float],
    current: float | None,
    baseline_rate: float | None,
    resets: tuple[float, ...],
    params: Mapping[str, Any],
) -> tuple[Hint, ...]:
    start, end = window
    b0, b1 = baseline
    hints: list[Hint] = []
    info = data.info
    # restart or counter reset: a cold cache drags the hit rate down for up to a window after the
    # restart, so look back two windows (the alert may fire a `for` after the restart).
    lookback = start - float(params.get("restart_lookback_s", end - start))
    restart_events = [
        e for e in data.events if e.get("kind") in RESTART_EVENTS and lookback <= float(e.get("ts", 0)) <= end
    ]
    resets = tuple(sorted(set(resets) | set(window_increase(data.series.get(PROMPT_TOKENS), lookback, end).resets)))
    if resets or restart_events:
        when = max([*resets, *(float(e["ts"]) for e in restart_events)])
        hints.append(
            Hint(
                "restart",
                f"the server restarted (counters reset) {end - when:.0f} s ago: its prefix cache starts "
                "cold, so hits come back as traffic repeats",
            )
        )
    # config change
    cfg_margin = float(params.get("config_change_lookback_s", end - start))
    changes = [
        e
        for e in data.events
        if e.get("kind") == "config_change" and start - cfg_margin <= float(e.get("ts", 0)) <= end
    ]
    if changes:
        hints.append(
            Hint(
                "config_change",
                f"config changed {end - float(changes[0]['ts']):.0f} s ago: "
                + str(changes[0].get("message", ""))[:300],
            )
        )
    # workload shift
    rps_now, len_now = _requests(data, start, end)
    rps_base, len_base = _requests(data, b0, b1)
    shift_margin = float(params.get("shift_margin", 0.5))
    moved: list[str] = []
    if _moved(rps_base, rps_now, shift_margin) and rps_base is not None and rps_now is not None:
        moved.append(f"request rate {rps_base:.2f}/s -> {rps_now:.2f}/s ({_pct(rps_base, rps_now)})")
    if _moved(len_base, len_now, float(params.get("length_margin", 0.3))) and len_base and len_now:
        moved.append(f"mean prompt length {len_base:.0f} -> {len_now:.0f} tokens ({_pct(len_base, len_now)})")
    mix_now, mix_base = length_mix(data, start, end), length_mix(data, b0, b1)
    if mix_now is not None and mix_base is not None:
        tv, what = _mix_shift(mix_base, mix_now)
        if tv > float(params.get("mix_margin", 0.3)):
            moved.append(f"prompt length mix moved (total variation {tv:.2f}): {what}")
    # offload tier saturating
    fails = window_increase(data.series.get(ALLOC_FAILURES), start, end).value
    saturated = fails is not None and fails > 0
    # connector answering no hits
    ext_q = window_increase(data.series.get(EXT_QUERIES), start, end).value
    ext_h = window_increase(data.series.get(EXT_HITS), start, end).value
    base_ext_h = window_increase(data.series.get(EXT_HITS), b0, b1).value
    # ... while prompts still share prefixes (the GPU cache keeps hitting): with unique prompts the
    # tier has nothing to find, and that is a workload shift, not a silent connector.
    gpu_now = hit_rate(data.series, "gpu", start, end).rate
    gpu_base = hit_rate(data.series, "gpu", b0, b1).rate
    reuse_continues = gpu_now is not None and gpu_base is not None and gpu_base > 0 and gpu_now >= 0.5 * gpu_base
    silent = (
        ext_q is not None
        and ext_q > 0
        and (ext_h or 0.0) == 0.0
        and ((base_ext_h or 0.0) > 0 or offload_configured(info))
        and reuse_continues
    )
    explained = bool(resets or restart_events or changes or saturated or silent)
    if not moved and not explained and current is not None and baseline_rate is not None:
        # Same pool, no restart, no config change: the prompts themselves share fewer prefixes.
        moved.append(
            f"prompts share fewer prefixes: hit rate {current:.0%} now vs {baseline_rate:.0%} before "
            "at the same volume, with no restart or config change"
        )
    if moved:
        hints.append(Hint("workload_shift", "workload shift: " + "; ".join(moved)))
    # hybrid model with big blocks
    hint = _hybrid_hint(data, b0, b1, len_now, params)
    if hint is not None:
        hints.append(hint)
    if saturated:
        hints.append(
            Hint(
                "offload_saturated",
                f"offload tier saturating: {fails:.0f} allocation failure(s) "
                "in the window (CPU buffer full; stores dropped)",
            )
        )
    if silent:
        hints.append(
            Hint(
                "connector_silent",
                f"KV connector not answering: {ext_q:.0f} tokens looked up in the offload tier, 0 found",
            )
        )
    return tuple(hints)


def _hybrid_hint(
    data: TargetData, b0: float, b1: float, len_now: float | None, params: Mapping[str, Any]
) -> Hint | None:
    raw = _config_value(data.info, "block_size")
    try:
        block = int(float(raw)) if raw is not None else None
    except ValueError:
        block = None
    if block is None:
        return None
    mamba = _config_value(data.info, "mamba_cache_mode")
    hybrid = (mamba not in (None, "", "None", "none")) or block > int(params.get("hybrid_block_tokens", 256))
    if not hybrid:
        return None
    # typical shared prefix: cached tokens per request in the baseline, else the prompt length now
    cached = window_increase(
        data.series.get(BY_SOURCE), b0, b1, where=lambda lab: lab.get("source") in CACHED_SOURCES
    ).value
    count = window_increase(data.series.get(PROMPT_LEN_COUNT), b0, b1).value
    typical = cached / count if cached and count else len_now
    if typical is not None and typical >= block:
        return None
    typ = f"~{typical:.0f}" if typical is not None else "unknown"
    return Hint(
        "hybrid_block_size",
        f"block_size is {block} tokens (hybrid model: hits only at whole blocks) and typical shared "
        f"prefixes are {typ} tokens: shorter prefixes never hit",
    )
