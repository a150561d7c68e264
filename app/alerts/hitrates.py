"""Prefix-cache hit rates over a window, with the definitions and the one fallback order of
kvcore.kv_vocabulary (vLLM's own: gpu = hits/queries, offload = external hits/queries, overall =
cached/prompt tokens), plus the resets seen inside the window.

Every increase is reset-corrected, so a restart inside the window neither adds negative tokens
nor double counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.alerts.series import SeriesMap, Window, window_increase
from kvcore import kv_vocabulary as kv
from kvcore.series import share

PROMPT_TOKENS = kv.PROMPT_TOKENS
BY_SOURCE = kv.BY_SOURCE
CACHED = kv.CACHED
GPU_HITS = kv.GPU_HITS
GPU_QUERIES = kv.GPU_QUERIES
EXT_HITS = kv.EXT_HITS
EXT_QUERIES = kv.EXT_QUERIES
CACHED_SOURCES = kv.CACHED_SOURCE_LABELS

TIERS = ("overall", "gpu", "offload")

# What each tier's hit rate needs (for the loader).
TIER_METRICS: dict[str, tuple[str, ...]] = kv.HIT_RATE_FAMILIES


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

    def counter(name: str) -> Window | None:
        return _valued(window_increase(series.get(name), start, end))

    def sources(labels: frozenset[str] | None) -> Window | None:
        where = None if labels is None else (lambda lab: lab.get("source") in labels)
        return _valued(window_increase(series.get(BY_SOURCE), start, end, where=where))

    hits_w, den_w = kv.overall_terms(counter, sources)
    resets = tuple(sorted({t for w in (hits_w, den_w) if w is not None for t in w.resets}))
    hits = hits_w.value if hits_w is not None else None
    den = den_w.value if den_w is not None else None
    return HitRate(share(hits, den), hits, den, resets)


def _valued(w: Window) -> Window | None:
    return w if w.value is not None else None


def _simple(series: SeriesMap, hits: str, queries: str, start: float, end: float) -> HitRate:
    h = window_increase(series.get(hits), start, end)
    q = window_increase(series.get(queries), start, end)
    resets = tuple(sorted(set(h.resets) | set(q.resets)))
    return HitRate(share(h.value, q.value), h.value, q.value, resets)
