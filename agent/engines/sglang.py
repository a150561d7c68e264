"""SGLang (``sglang:``), with HiCache (GPU -> host DRAM L2 -> storage L3), into the KV vocabulary.

Read from SGLang's own collectors (python/sglang/srt/observability/metrics_collector.py, 0.5.23):
- Token sources: ``sglang:prefill_effective_tokens_total{mode=input|device_hit|host_hit|storage_hit}``
  (scheduler side, retracted re-counts excluded) -> prompt tokens by source: input = local_compute,
  device_hit = local_cache_hit (GPU), host_hit = external_kv_transfer from CPU, storage_hit =
  external_kv_transfer from storage. Older builds without it: the tokenizer side's
  ``sglang:cached_tokens_total{cache_source=device|host|storage|total}`` and
  ``sglang:prompt_tokens_total`` (compute = prompt - cached). ``cache_source="total"`` is written
  only when a request had no per-tier detail: it counts as cached, tier unknown, and is never
  added to the per-tier series (no double count).
- Prefix-cache hit rates in vLLM's terms: GPU = device_hit / all prompt tokens; offload =
  (host_hit + storage_hit) / (tokens not found on the GPU).
- Transfers: ``sglang:load_back_bytes_total`` (host -> GPU) and ``sglang:hicache_backup_bytes_total``
  (GPU -> host) with their duration histograms' ``_sum`` as the offload load/store bytes and time
  (bytes are each rank's own shard, summed over ranks, as vLLM sums its TP workers); L3 traffic
  in tokens from ``sglang:prefetched_tokens_total`` / ``sglang:backuped_tokens_total``.
- Capacity: ``sglang:max_total_num_tokens`` with ``kv_used_tokens`` + ``kv_evictable_tokens``
  (GPU), ``sglang:hicache_host_total_tokens`` / ``_used_tokens`` (CPU).
- SGLang's own hit rate: ``sglang:cache_hit_rate`` = hit tokens (all tiers) / prompt tokens of the
  last stats interval (a windowed gauge, shown as reported).
Token counters that "every TP rank reports the same" (SGLang's own help text) are read from the
lowest tp_rank of each group, not summed.
"""

from __future__ import annotations

from agent.engines.kv_series import (
    CPU,
    ENGINE_HIT_RATE,
    GPU,
    STORAGE,
    TIER_CAPACITY_TOKENS,
    TIER_HIT_TOKENS,
    TIER_LOOKUP_TOKENS,
    TIER_TRANSFER_BYTES,
    TIER_TRANSFER_TOKENS,
    TIER_USED_TOKENS,
    Derived,
    Samples,
    by_name,
    copy_family,
    first,
    total,
)
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
    LOAD_TIME,
    OFFLOAD_RELOAD,
    PROMPT_TOKENS,
    RECOMPUTE,
    STORE_BYTES,
    STORE_TIME,
)

NAME = "sglang"
TITLE = "SGLang"
PREFIXES: tuple[str, ...] = ("sglang:",)
KEEP: tuple[str, ...] = (
    "sglang:prefill_effective_tokens",
    "sglang:cached_tokens",
    "sglang:prompt_tokens_total",
    "sglang:load_back_",
    "sglang:hicache_",
    "sglang:evicted_tokens",
    "sglang:prefetched_tokens",
    "sglang:backuped_tokens",
    "sglang:storage_prefetch_",
    "sglang:max_total_num_tokens",
    "sglang:kv_used_tokens",
    "sglang:kv_evictable_tokens",
    "sglang:kv_available_tokens",
    "sglang:token_usage",
    "sglang:cache_hit_rate",
    "sglang:page_size",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:time_to_first_token_seconds",
)
HIT_RATE_DEFINITION = "hit tokens (device+host+storage) / prompt tokens, last stats interval"
_MODES = {"input": "input", "device_hit": "device", "host_hit": "host", "storage_hit": "storage"}
Rows = list[tuple[dict[str, str], float]]


def one_rank(rows: Rows) -> Rows:
    """Of series that differ only by tp_rank, the lowest rank's (SGLang repeats them per rank)."""
    best: dict[tuple[tuple[str, str], ...], tuple[int, dict[str, str], float]] = {}
    for labels, value in rows:
        try:
            rank = int(labels.get("tp_rank", "0"))
        except ValueError:
            rank = 0
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "tp_rank"))
        if key not in best or rank < best[key][0]:
            best[key] = (rank, labels, value)
    return [(labels, value) for _r, labels, value in best.values()]


def _by_label(rows: Rows, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in rows:
        k = labels.get(label, "")
        out[k] = out.get(k, 0.0) + value
    return out


def read(samples: Samples, block_size: int | None = None) -> Derived:
    d = Derived(NAME)
    fam = by_name(samples, "sglang:")

    def rows(name: str) -> Rows:
        return fam.get(name, [])

    effective = _by_label(one_rank(rows("sglang:prefill_effective_tokens_total")), "mode")
    tiers = {_MODES[m]: v for m, v in effective.items() if m in _MODES}
    cached_src = _by_label(rows("sglang:cached_tokens_total"), "cache_source")
    prompt = total(rows("sglang:prompt_tokens_total"))
    if not tiers and cached_src and prompt is not None:
        cached_all = sum(cached_src.values())
        tiers = {k: cached_src.get(k, 0.0) for k in ("device", "host", "storage")}
        tiers["input"] = max(0.0, prompt - cached_all)
        if cached_src.get("total"):
            d.add(BY_SOURCE, {"source": "cached_unattributed"}, cached_src["total"])
        d.notes.append("token sources from the tokenizer's cached_tokens_total (no prefill_effective_tokens)")
    if tiers:
        d.add(BY_SOURCE, {"source": RECOMPUTE.vllm_label}, tiers.get("input", 0.0))
        d.add(BY_SOURCE, {"source": GPU_HIT.vllm_label, "tier": GPU}, tiers.get("device", 0.0))
        d.add(BY_SOURCE, {"source": OFFLOAD_RELOAD.vllm_label, "tier": CPU}, tiers.get("host", 0.0))
        if "storage" in tiers:
            d.add(BY_SOURCE, {"source": OFFLOAD_RELOAD.vllm_label, "tier": STORAGE}, tiers["storage"])
        everything = sum(tiers.values())
        not_on_gpu = everything - tiers.get("device", 0.0)
        offload_hits = tiers.get("host", 0.0) + tiers.get("storage", 0.0)
        d.add(GPU_QUERIES, {}, everything)
        d.add(GPU_HITS, {}, tiers.get("device", 0.0))
        d.add(EXT_QUERIES, {}, not_on_gpu)
        d.add(EXT_HITS, {}, offload_hits)
        lookups = {GPU: everything, CPU: not_on_gpu, STORAGE: not_on_gpu - tiers.get("host", 0.0)}
        hits = {GPU: tiers.get("device", 0.0), CPU: tiers.get("host", 0.0), STORAGE: tiers.get("storage", 0.0)}
        for tier, looked in lookups.items():
            if tier == STORAGE and "storage" not in tiers:
                continue
            d.add(TIER_LOOKUP_TOKENS, {"tier": tier, "definition": "prefill_effective_tokens"}, looked)
            d.add(TIER_HIT_TOKENS, {"tier": tier, "definition": "prefill_effective_tokens"}, hits[tier])
    if prompt is not None:
        d.add(PROMPT_TOKENS, {}, prompt)
    if cached_src:
        d.add(CACHED, {}, sum(cached_src.values()))
        for src, value in cached_src.items():
            d.add(CACHED_BY_SOURCE, {"source": src or "(none)"}, value)

    # transfers GPU <-> host (L2): bytes and busy time, as the offload load/store families
    load_b = total(rows("sglang:load_back_bytes_total"))
    store_b = total(rows("sglang:hicache_backup_bytes_total"))
    d.add(LOAD_BYTES, {"tier": CPU}, load_b)
    d.add(STORE_BYTES, {"tier": CPU}, store_b)
    d.add(LOAD_TIME, {"tier": CPU}, total(rows("sglang:load_back_duration_seconds_sum")))
    d.add(STORE_TIME, {"tier": CPU}, total(rows("sglang:hicache_backup_duration_seconds_sum")))
    cpu_path = {"tier": CPU}
    d.add(TIER_TRANSFER_BYTES, {**cpu_path, "direction": "load", "path": "CPU->GPU"}, load_b)
    d.add(TIER_TRANSFER_BYTES, {**cpu_path, "direction": "store", "path": "GPU->CPU"}, store_b)
    d.add(
        TIER_TRANSFER_TOKENS,
        {**cpu_path, "direction": "load", "path": "CPU->GPU"},
        total(one_rank(rows("sglang:load_back_tokens_total"))),
    )
    d.add(
        TIER_TRANSFER_TOKENS,
        {**cpu_path, "direction": "store", "path": "GPU->CPU"},
        total(one_rank(rows("sglang:hicache_backup_tokens_total"))),
    )
    # host (L2) <-> storage (L3)
    l3 = {"tier": STORAGE}
    d.add(
        TIER_TRANSFER_TOKENS,
        {**l3, "direction": "load", "path": "storage->CPU"},
        total(one_rank(rows("sglang:prefetched_tokens_total"))),
    )
    d.add(
        TIER_TRANSFER_TOKENS,
        {**l3, "direction": "store", "path": "CPU->storage"},
        total(one_rank(rows("sglang:backuped_tokens_total"))),
    )

    # capacity and occupancy
    gpu_cap = first(one_rank(rows("sglang:max_total_num_tokens")))
    used = first(one_rank(rows("sglang:kv_used_tokens")))
    evictable = first(one_rank(rows("sglang:kv_evictable_tokens")))
    d.add(TIER_CAPACITY_TOKENS, {"tier": GPU}, gpu_cap)
    if used is not None:
        d.add(TIER_USED_TOKENS, {"tier": GPU}, used + (evictable or 0.0))
        if gpu_cap:
            d.add("vllm:kv_cache_usage_perc", {}, used / gpu_cap)
    d.add(TIER_CAPACITY_TOKENS, {"tier": CPU}, first(one_rank(rows("sglang:hicache_host_total_tokens"))))
    d.add(TIER_USED_TOKENS, {"tier": CPU}, first(one_rank(rows("sglang:hicache_host_used_tokens"))))
    d.add(
        ENGINE_HIT_RATE,
        {"tier": "all", "definition": HIT_RATE_DEFINITION},
        first(one_rank(rows("sglang:cache_hit_rate"))),
    )
    # same meaning, the dashboard's names: TTFT, running and waiting requests
    ttft = "sglang:time_to_first_token_seconds"
    copy_family(d, samples, ttft, "vllm:time_to_first_token_seconds", "histogram")
    d.add("vllm:num_requests_running", {}, total(rows("sglang:num_running_reqs")))
    d.add("vllm:num_requests_waiting", {}, total(rows("sglang:num_queue_reqs")))
    return d


def block_size(samples: Samples) -> float | None:
    """SGLang's page size (tokens per KV page), from ``sglang:page_size``."""
    return first(by_name(samples, "sglang:page_size").get("sglang:page_size", []))
