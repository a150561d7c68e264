"""Prefix-cache hit rates with vLLM's own definitions (fixtures/vllm/NOTES.md):

- gpu:     increase(prefix_cache_hits) / increase(prefix_cache_queries)
- offload: increase(external_prefix_cache_hits) / increase(external_prefix_cache_queries)
- overall: increase(prompt_tokens_cached) / increase(prompt_tokens), where cached =
           local_cache_hit + external_kv_transfer of prompt_tokens_by_source
           (fallback: vllm:prompt_tokens_cached_total; denominator fallback: sum of by_source).

Every increase is reset-corrected, so a restart inside the window neither adds negative tokens
nor double counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.alerts.series import SeriesMap, ratio, window_increase

PROMPT_TOKENS = "vllm:prompt_tokens_total"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
CACHED = "vllm:prompt_tokens_cached_total"
GPU_HITS = "vllm:prefix_cache_hits_total"
GPU_QUERIES = "vllm:prefix_cache_queries_total"
EXT_HITS = "vllm:external_prefix_cache_hits_total"
EXT_QUERIES = "vllm:external_prefix_cache_queries_total"
CACHED_SOURCES = frozenset({"local_cache_hit", "external_kv_transfer"})

TIERS = ("overall", "gpu", "offload")

# What each tier's hit rate needs (for the loader).
TIER_METRICS: dict[str, tuple[str, ...]] = {
    "overall": (PROMPT_TOKENS, BY_SOURCE, CACHED),
    "gpu": (GPU_HITS, GPU_QUERIES),
    "offload": (EXT_HITS, EXT_QUERIES),
}


@dataclass(frozen=True)
class HitRate:
    rate: float | None  # 0..1, None when the volume is zero or unknown
    hits: float | None
    volume: float | None  # tokens looked up (the denominator)
    resets: tuple[float, ...] = ()


def hit_rate(series: SeriesMap, tier: str, start: float, end: float) -> HitRate:
    if tier == "gpu":
        return _simple(series, GPU_HITS, GPU_QUERIES, start, end)
    if tier == "offload":
        return _simple(series, EXT_HITS, EXT_QUERIES, start, end)
    if tier != "overall":
        raise ValueError(f"unknown hit-rate tier {tier!r}")
    by_source = series.get(BY_SOURCE)
    hits_w = window_increase(by_source, start, end, where=lambda lab: lab.get("source") in CACHED_SOURCES)
    if hits_w.value is None:
        hits_w = window_increase(series.get(CACHED), start, end)
    den_w = window_increase(series.get(PROMPT_TOKENS), start, end)
    if den_w.value is None:
        den_w = window_increase(by_source, start, end)
    resets = tuple(sorted(set(hits_w.resets) | set(den_w.resets)))
    return HitRate(ratio(hits_w.value, den_w.value), hits_w.value, den_w.value, resets)


def _simple(series: SeriesMap, hits: str, queries: str, start: float, end: float) -> HitRate:
    h = window_increase(series.get(hits), start, end)
    q = window_increase(series.get(queries), start, end)
    resets = tuple(sorted(set(h.resets) | set(q.resets)))
    return HitRate(ratio(h.value, q.value), h.value, q.value, resets)
