"""TensorRT-LLM (``trtllm_``) into the KV vocabulary: GPU block reuse, host offload, tiers by level.

Families as tensorrt_llm/metrics/collector.py (upstream main, 2026) declares them, served by
``trtllm-serve`` at ``/prometheus/metrics`` (its ``/metrics`` answers JSON iteration statistics,
read below as a fallback). Dynamo's TensorRT-LLM worker re-exports them with ``trtllm_`` (older
Dynamo docs: ``trtllm:``); both spellings are read.
- Token sources: ``trtllm_prompt_tokens_total``, ``trtllm_prompt_cached_tokens_total`` and
  ``trtllm_prompt_cache_hit_tokens_total{cache_level, cache_tier}`` (tokens served from each KV
  level; "pages already prefetched from disk to host count as host"). cache_tier gpu ->
  local_cache_hit, host -> external_kv_transfer from CPU, disk -> from disk; compute = prompt -
  cached. Without the per-level family the cached tokens are "cached_unattributed".
- Block reuse: ``trtllm_kv_cache_reused_blocks_total`` / ``_missed_blocks_total`` (deltas of the
  engine's cumulative kvCacheStats). TensorRT-LLM's own hit rate, ``trtllm_kv_cache_hit_rate``, is
  reused / (reused + missed) blocks; reuse includes blocks brought back from the host pool, so
  it is a GPU+host rate. Converted to tokens with ``trtllm_kv_cache_tokens_per_block``.
- Transfers: ``trtllm_kv_cache_onboard_bytes_total`` (host -> GPU) and
  ``trtllm_kv_cache_offload_bytes_total`` (GPU -> host); no transfer time is exported, so the
  load speed (GB/s while transferring) cannot be computed for TensorRT-LLM.
- Capacity: ``trtllm_kv_cache_max_blocks`` / ``_used_blocks`` x tokens per block (GPU),
  ``trtllm_kv_cache_utilization`` (GPU, used / max blocks), ``trtllm_kv_cache_host_utilization``
  (secondary pool, a ratio only).
"""

from __future__ import annotations

import math
from typing import Any

from agent.engines.kv_series import (
    CPU,
    DISK,
    ENGINE_HIT_RATE,
    ENGINE_PINNED_BYTES,
    GPU,
    TIER_CAPACITY_TOKENS,
    TIER_HIT_TOKENS,
    TIER_LOOKUP_TOKENS,
    TIER_TRANSFER_BLOCKS,
    TIER_TRANSFER_BYTES,
    TIER_TRANSFER_TOKENS,
    TIER_USAGE_RATIO,
    TIER_USED_TOKENS,
    Derived,
    Samples,
    by_name,
    converted,
    copy_family,
    first,
    total,
)
from kvcore.exposition import RawSample
from kvcore.kv_vocabulary import (
    BY_SOURCE,
    CACHED,
    CACHED_BY_SOURCE,
    EXT_HITS,
    EXT_QUERIES,
    GPU_HIT,
    GPU_HITS,
    GPU_QUERIES,
    LOAD_BYTES,
    OFFLOAD_RELOAD,
    PROMPT_TOKENS,
    RECOMPUTE,
    STORE_BYTES,
)

NAME = "trtllm"
TITLE = "TensorRT-LLM"
PREFIXES: tuple[str, ...] = ("trtllm_", "trtllm:")
KEEP: tuple[str, ...] = (
    "trtllm_prompt_",
    "trtllm_kv_cache_",
    "trtllm_pinned_memory_usage_bytes",
    "trtllm_num_requests_",
    "trtllm_time_to_first_token_seconds",
    "trtllm:prompt_",
    "trtllm:kv_cache_",
    "trtllm:num_requests_",
)
METRICS_PATH = "/prometheus/metrics"
HIT_RATE_DEFINITION = "reused / (reused + missed) KV blocks (kvCacheStats.cacheHitRate; reuse includes host)"
ITER_RATE_DEFINITION = "reused / (reused + missed) KV blocks of the last iteration"
# cache_tier label values -> (prompt_tokens_cached_by_source source, tier)
_TIERS = {"gpu": ("device", GPU), "host": ("host", CPU), "cpu": ("host", CPU), "disk": ("disk", DISK)}


def canonical(samples: Samples) -> Samples:
    """``trtllm:x`` (older Dynamo re-export) read as ``trtllm_x``."""
    return [(("trtllm_" + n[7:]) if n.startswith("trtllm:") else n, lab, v) for n, lab, v in samples]


def block_size(samples: Samples) -> float | None:
    """Tokens per KV block, from ``trtllm_kv_cache_tokens_per_block``."""
    rows = by_name(canonical(samples), "trtllm_kv_cache_tokens_per_block")
    return first(rows.get("trtllm_kv_cache_tokens_per_block", []))


def read(samples: Samples, block_size: int | None = None) -> Derived:
    d = Derived(NAME)
    fam = by_name(canonical(samples), "trtllm_")

    def t(name: str) -> float | None:
        return total(fam.get("trtllm_" + name, []))

    bs = block_size
    conv = converted(bs) if bs else {}
    prompt = t("prompt_tokens_total")
    by_level: dict[str, float] = {}
    for labels, value in fam.get("trtllm_prompt_cache_hit_tokens_total", []):
        tier = labels.get("cache_tier", "").lower() or f"level {labels.get('cache_level', '?')}"
        by_level[tier] = by_level.get(tier, 0.0) + value
    cached = t("prompt_cached_tokens_total")
    if cached is None and by_level:
        cached = sum(by_level.values())
    d.add(PROMPT_TOKENS, {}, prompt)
    d.add(CACHED, {}, cached)
    for tier, value in by_level.items():
        d.add(CACHED_BY_SOURCE, {"source": _TIERS.get(tier, (tier, tier))[0]}, value)
    if prompt is not None:
        d.add(BY_SOURCE, {"source": RECOMPUTE.vllm_label}, max(0.0, prompt - (cached or 0.0)))
        if by_level:
            gpu = sum(v for k, v in by_level.items() if _TIERS.get(k, ("", ""))[1] == GPU)
            d.add(BY_SOURCE, {"source": GPU_HIT.vllm_label, "tier": GPU}, gpu)
            for tier, value in by_level.items():
                name = _TIERS.get(tier, ("", tier))[1]
                if name != GPU:
                    d.add(BY_SOURCE, {"source": OFFLOAD_RELOAD.vllm_label, "tier": name}, value)
            d.add(GPU_QUERIES, {}, prompt)
            d.add(GPU_HITS, {}, gpu)
            d.add(EXT_QUERIES, {}, max(0.0, prompt - gpu))
            d.add(EXT_HITS, {}, sum(by_level.values()) - gpu)
        elif cached is not None:
            d.add(BY_SOURCE, {"source": "cached_unattributed"}, cached)

    reused, missed = t("kv_cache_reused_blocks_total"), t("kv_cache_missed_blocks_total")
    if reused is not None and missed is not None and bs:
        rate_def = {"tier": "GPU+host", "definition": "reused/(reused+missed) blocks", **conv}
        d.add(TIER_LOOKUP_TOKENS, rate_def, (reused + missed) * bs)
        d.add(TIER_HIT_TOKENS, rate_def, reused * bs)
    d.add(ENGINE_HIT_RATE, {"tier": "GPU+host", "definition": HIT_RATE_DEFINITION}, t("kv_cache_hit_rate"))
    d.add(ENGINE_HIT_RATE, {"tier": "GPU+host", "definition": ITER_RATE_DEFINITION}, t("kv_cache_iter_reuse_rate"))

    onboard, offload = t("kv_cache_onboard_bytes_total"), t("kv_cache_offload_bytes_total")
    d.add(LOAD_BYTES, {"tier": CPU}, onboard)
    d.add(STORE_BYTES, {"tier": CPU}, offload)
    d.add(TIER_TRANSFER_BYTES, {"tier": CPU, "direction": "load", "path": "CPU->GPU"}, onboard)
    d.add(TIER_TRANSFER_BYTES, {"tier": CPU, "direction": "store", "path": "GPU->CPU"}, offload)
    prefetch = t("kv_cache_disk_prefetch_blocks_total")
    disk = {"tier": DISK, "direction": "load", "path": "disk->CPU"}
    if bs and prefetch is not None:
        d.add(TIER_TRANSFER_TOKENS, {**disk, **conv}, prefetch * bs)
    else:
        d.add(TIER_TRANSFER_BLOCKS, disk, prefetch)

    max_blocks, used_blocks = t("kv_cache_max_blocks"), t("kv_cache_used_blocks")
    if bs:
        d.add(TIER_CAPACITY_TOKENS, {"tier": GPU, **conv}, None if max_blocks is None else max_blocks * bs)
        d.add(TIER_USED_TOKENS, {"tier": GPU, **conv}, None if used_blocks is None else used_blocks * bs)
    d.add("vllm:kv_cache_usage_perc", {}, t("kv_cache_utilization"))
    d.add(TIER_USAGE_RATIO, {"tier": CPU}, t("kv_cache_host_utilization"))
    d.add(ENGINE_PINNED_BYTES, {}, t("pinned_memory_usage_bytes"))
    # same meaning, the dashboard's names: TTFT, running and waiting requests
    canon = canonical(samples)
    copy_family(d, canon, "trtllm_time_to_first_token_seconds", "vllm:time_to_first_token_seconds", "histogram")
    d.add("vllm:num_requests_running", {}, t("num_requests_running"))
    d.add("vllm:num_requests_waiting", {}, t("num_requests_waiting"))
    return d


# ----------------------------------------------------------------------------- JSON fallback
MAX_ITERATIONS = 1000  # iteration records read from one /metrics answer


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def iteration_samples(payload: Any) -> Samples:
    """trtllm-serve's JSON ``/metrics`` (a list of iteration statistics, newest last) as the
    ``trtllm_`` samples its Prometheus collector would write for the newest record: the KV block
    gauges and the engine's cumulative reused/missed block counts. Anything else is ignored; a
    payload that is not a list of objects gives nothing."""
    if not isinstance(payload, list):
        return []
    records = [r for r in payload[-MAX_ITERATIONS:] if isinstance(r, dict)]
    if not records:
        return []
    last = records[-1]
    out: list[RawSample] = []
    kv = last.get("kvCacheStats")
    if isinstance(kv, dict):
        for key, name in (
            ("maxNumBlocks", "trtllm_kv_cache_max_blocks"),
            ("freeNumBlocks", "trtllm_kv_cache_free_blocks"),
            ("usedNumBlocks", "trtllm_kv_cache_used_blocks"),
            ("tokensPerBlock", "trtllm_kv_cache_tokens_per_block"),
            ("cacheHitRate", "trtllm_kv_cache_hit_rate"),
            ("reusedBlocks", "trtllm_kv_cache_reused_blocks_total"),
            ("missedBlocks", "trtllm_kv_cache_missed_blocks_total"),
        ):
            value = _num(kv.get(key))
            if value is not None:
                out.append((name, {}, value))
        used, most = _num(kv.get("usedNumBlocks")), _num(kv.get("maxNumBlocks"))
        if used is not None and most:
            out.append(("trtllm_kv_cache_utilization", {}, used / most))
    for key, name in (
        ("numActiveRequests", "trtllm_num_requests_running"),
        ("numQueuedRequests", "trtllm_num_requests_waiting"),
        ("pinnedMemUsage", "trtllm_pinned_memory_usage_bytes"),
    ):
        value = _num(last.get(key))
        if value is not None:
            out.append((name, {}, value))
    return out
