"""The KV vocabulary every part of kvscope speaks: where prompt tokens came from, how hit rates are
defined (one fallback order), which offload tier reloaded them, and their colours and labels.

Pure standard library, beside the wire contract (kvcore/protocol.py): the agent (workload
snapshots, probes) and the app (charts, overview, worth, summary API, exporter, alerts, A/B)
import the same definitions, so a hit rate or a source colour cannot drift between them.

Sources, as vLLM labels them in `vllm:prompt_tokens_by_source_total{source}`:
- local_cache_hit       -> gpu_hit         the GPU prefix cache supplied them
- external_kv_transfer  -> offload_reload  a KV connector reloaded them (CPU, disk, LMCache, ...)
- local_compute         -> recompute       prefilled again
Unknown source label values pass through under their own name.

Hit rates (vLLM's own definitions, fixtures/vllm/NOTES.md), each a ratio of increases over one
window (never a mean of per-instant ratios):
- gpu:     prefix_cache_hits / prefix_cache_queries
- offload: external_prefix_cache_hits / external_prefix_cache_queries
- overall: cached prompt tokens / prompt tokens, where
    cached  = prompt_tokens_cached_total (vLLM's own definition),
              else local_cache_hit + external_kv_transfer of prompt_tokens_by_source;
    prompts = prompt_tokens_total, else the sum of prompt_tokens_by_source.
  vLLM keeps both equal (prompt_tokens_cached == local_cache_hit + external_kv_transfer), so the
  fallbacks only matter on builds lacking a family; vLLM's own counter comes first because the
  by-source counter is the one with a known decrement bug.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from kvcore.series import share

# --- metric families -------------------------------------------------------------------------
PROMPT_TOKENS = "vllm:prompt_tokens_total"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
CACHED = "vllm:prompt_tokens_cached_total"
CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"
GPU_HITS = "vllm:prefix_cache_hits_total"
GPU_QUERIES = "vllm:prefix_cache_queries_total"
EXT_HITS = "vllm:external_prefix_cache_hits_total"
EXT_QUERIES = "vllm:external_prefix_cache_queries_total"
LOAD_BYTES = "vllm:kv_offload_load_bytes_total"
LOAD_TIME = "vllm:kv_offload_load_time_total"
STORE_BYTES = "vllm:kv_offload_store_bytes_total"
STORE_TIME = "vllm:kv_offload_store_time_total"
OFFLOAD_BYTES = {"load": LOAD_BYTES, "store": STORE_BYTES}  # by direction (load: tier -> GPU)
OFFLOAD_TIME = {"load": LOAD_TIME, "store": STORE_TIME}
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
REQUEST_SUCCESS = "vllm:request_success_total"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
TTFT = "vllm:time_to_first_token_seconds"  # histograms: the family name, without _bucket/_sum/_count
ITL = "vllm:inter_token_latency_seconds"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
OFFLOAD_CONFIG_INFO = "vllm:kv_offload_config_info"
KV_FETCH_BY_STAGE = "vllm:num_requests_kv_fetch_by_stage"
TIERING_PREFIX = "vllm:kv_offload_tiering_"
LMCACHE_PREFIX = "lmcache:"
LMCACHE_HITS = "lmcache:num_hit_tokens_total"  # present where an LMCache engine runs in vLLM


# --- colours ---------------------------------------------------------------------------------
# Tableau 10, the one definition of every chart colour (app/charts/palette.py gives them roles).
GREEN = "#2ca02c"
BLUE = "#1f77b4"
RED = "#d62728"
ORANGE = "#ff7f0e"
PURPLE = "#9467bd"
BROWN = "#8c564b"
PINK = "#e377c2"
GREY = "#7f7f7f"
OLIVE = "#bcbd22"
CYAN = "#17becf"


# --- token sources ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenSource:
    key: str  # gpu_hit | offload_reload | recompute (the summary API's keys)
    vllm_label: str  # value of the `source` label of prompt_tokens_by_source
    label: str  # what a person reads; the offload one is completed by the tier's name
    color: str


GPU_HIT = TokenSource("gpu_hit", "local_cache_hit", "GPU prefix-cache hit", GREEN)
OFFLOAD_RELOAD = TokenSource("offload_reload", "external_kv_transfer", "offload reload", BLUE)
RECOMPUTE = TokenSource("recompute", "local_compute", "recompute", RED)
SOURCES: tuple[TokenSource, ...] = (GPU_HIT, OFFLOAD_RELOAD, RECOMPUTE)  # stacking order
SOURCE_BY_LABEL: dict[str, TokenSource] = {s.vllm_label: s for s in SOURCES}
CACHED_SOURCE_LABELS: frozenset[str] = frozenset({GPU_HIT.vllm_label, OFFLOAD_RELOAD.vllm_label})


def source_label(vllm_label: str, tier: str | None = None) -> str:
    """How a source is named on screen: the offload reload by the tier it came from."""
    src = SOURCE_BY_LABEL.get(vllm_label)
    if src is None:
        return vllm_label or "(no source label)"
    if src is OFFLOAD_RELOAD:
        return f"{tier or 'offload'} reload"
    return src.label


def source_color(vllm_label: str) -> str | None:
    src = SOURCE_BY_LABEL.get(vllm_label)
    return src.color if src is not None else None


# --- offload tiers ---------------------------------------------------------------------------
# prompt_tokens_cached_by_source{source}: the tier that supplied cached tokens (device = GPU)
CACHED_SOURCE_TIERS: dict[str, str | None] = {
    "device": None,
    "host": "CPU",
    "disk": "disk",
    "p2p": "peer instance (p2p)",
    "external_unspecified": "external connector",
}
# --kv-transfer-config's kv_connector: what the connector stores into (vLLM's built-in ones)
CONNECTOR_TIERS: dict[str, str] = {
    "OffloadingConnector": "CPU",
    "ExampleConnector": "disk",  # files under shared_storage_path
    "SharedStorageConnector": "disk",  # ExampleConnector's earlier name
    "LMCacheConnectorV1": "LMCache",
    "LMCacheConnector": "LMCache",
    "NixlConnector": "peer instance (NIXL)",
    "P2pNcclConnector": "peer instance (NCCL)",
    "MooncakeConnector": "Mooncake store",
}
# --kv-offloading-backend (cache_config_info kv_offloading_backend)
BACKEND_TIERS: dict[str, str] = {"native": "CPU", "lmcache": "LMCache"}
# TieringOffloadingSpec tier label kinds: "0:primary", "1:fs", "2:obj"
TIERING_KINDS: dict[str, str] = {"primary": "CPU", "cpu": "CPU", "fs": "disk", "obj": "object store"}


def configured_offload_gib(cache_config: Mapping[str, Any] | None) -> float | None:
    """kv_offloading_size of cache_config_info in GiB; None when off ("None", 0) or unreadable."""
    raw = (cache_config or {}).get("kv_offloading_size")
    if raw is None or str(raw).strip() in ("", "None", "none"):
        return None
    try:
        gib = float(str(raw))
    except ValueError:
        return None
    return gib if gib > 0 and gib == gib and gib != float("inf") else None


def connector_from_argv(argv: Iterable[str]) -> str | None:
    """kv_connector of a vLLM command line's --kv-transfer-config JSON; None without one."""
    import json

    items = list(argv)
    for i, item in enumerate(items):
        raw: str | None = None
        if item == "--kv-transfer-config" and i + 1 < len(items):
            raw = items[i + 1]
        elif item.startswith("--kv-transfer-config="):
            raw = item.split("=", 1)[1]
        if raw is None:
            continue
        try:
            cfg = json.loads(raw)
        except ValueError:
            return None
        name = cfg.get("kv_connector") if isinstance(cfg, dict) else None
        return str(name) if name else None
    return None


def offload_tiers(
    cache_config: Mapping[str, Any] | None,
    *,
    cached_sources: Iterable[str] = (),
    tiering_tiers: Iterable[str] = (),
    lmcache: bool = False,
    connector: str | None = None,
) -> list[str]:
    """The offload tiers an instance has, named by what they are (CPU, disk, LMCache, ...), in
    order: the configured backend or the known KV connector, TieringOffloadingSpec tiers, tiers
    that supplied cached tokens (cached_sources: source labels of prompt_tokens_cached_by_source
    seen moving; with a known connector its "external_unspecified" tokens are that connector's),
    LMCache metrics. Empty when nothing shows an offload tier."""
    names: list[str] = []

    def add(name: str | None) -> None:
        if name and name not in names:
            names.append(name)

    backend = str((cache_config or {}).get("kv_offloading_backend") or "")
    if configured_offload_gib(cache_config) is not None:
        add(BACKEND_TIERS.get(backend.lower(), backend if backend not in ("", "None") else "CPU"))
    connector_tier = CONNECTOR_TIERS.get(connector, connector) if connector else None
    add(connector_tier)
    for tier in tiering_tiers:
        kind = tier.split(":", 1)[-1].lower()
        add(TIERING_KINDS.get(kind, kind or None))
    for src in cached_sources:
        if src == "external_unspecified" and connector_tier:
            continue
        add(CACHED_SOURCE_TIERS.get(src, src or None))
    if lmcache:
        add("LMCache")
    return names


def tier_name(tiers: Iterable[str]) -> str | None:
    """One name for the offload tiers: "CPU", "CPU + disk", ...; None when there is none."""
    names = list(tiers)
    return " + ".join(names) if names else None


# --- hit rates -------------------------------------------------------------------------------
@dataclass(frozen=True)
class HitRateDef:
    key: str  # gpu | offload | overall
    label: str
    color: str
    hits: str  # the numerator's family (overall: see overall_terms for its fallbacks)
    queries: str
    meaning: str
    # the key of this rate in an A/B run's counters and summary (stored with every run, so kept as
    # first written: "external_hit_rate" is the offload rate; the Python side says "offload")
    run_key: str


HIT_GPU = HitRateDef(
    "gpu", "GPU prefix cache", GPU_HIT.color, GPU_HITS, GPU_QUERIES, "GPU prefix-cache hits / queries", "gpu_hit_rate"
)
HIT_OFFLOAD = HitRateDef(
    "offload",
    "offload tier",
    OFFLOAD_RELOAD.color,
    EXT_HITS,
    EXT_QUERIES,
    "external (connector) hits / queries",
    "external_hit_rate",
)
HIT_OVERALL = HitRateDef(
    "overall", "overall", ORANGE, CACHED, PROMPT_TOKENS, "cached prompt tokens / prompt tokens", "overall_hit_rate"
)
HIT_RATES: tuple[HitRateDef, ...] = (HIT_GPU, HIT_OFFLOAD, HIT_OVERALL)
HIT_RATE_NOTE = "GPU = hits/queries; offload = external hits/queries; overall = cached/prompt tokens."
# every family a hit rate may read, per rate
HIT_RATE_FAMILIES: dict[str, tuple[str, ...]] = {
    "gpu": (GPU_HITS, GPU_QUERIES),
    "offload": (EXT_HITS, EXT_QUERIES),
    "overall": (BY_SOURCE, CACHED, PROMPT_TOKENS),
}

T = TypeVar("T")


def overall_terms(
    counter: Callable[[str], T | None], by_source: Callable[[frozenset[str] | None], T | None]
) -> tuple[T | None, T | None]:
    """(cached tokens, prompt tokens) of the overall hit rate, in the one fallback order.

    `counter(name)` is a family's increase (or rate) over the window, None when absent;
    `by_source(labels)` the same summed over prompt_tokens_by_source series whose source is in
    `labels` (None: every source), None when no such series. Works on floats and on per-instant
    value lists alike: each consumer brings its own arithmetic, the order is defined here."""
    cached = counter(CACHED)
    if cached is None:
        cached = by_source(CACHED_SOURCE_LABELS)
    prompts = counter(PROMPT_TOKENS)
    if prompts is None:
        prompts = by_source(None)
    return cached, prompts


@dataclass(frozen=True)
class HitRates:
    gpu: float | None
    offload: float | None
    overall: float | None

    def by_run_key(self) -> dict[str, float | None]:
        """The three rates under the keys an A/B run stores them by (HitRateDef.run_key)."""
        return {HIT_GPU.run_key: self.gpu, HIT_OFFLOAD.run_key: self.offload, HIT_OVERALL.run_key: self.overall}


def hit_rates(increases: Mapping[str, float | None], by_source: Mapping[str, float]) -> HitRates:
    """The three hit rates of one window from scalar increases: `increases` by family name (absent
    or None: the server does not export it), `by_source` the increase per source label."""

    def counter(name: str) -> float | None:
        return increases.get(name)

    def sources(labels: frozenset[str] | None) -> float | None:
        vals = [v for k, v in by_source.items() if labels is None or k in labels]
        return sum(vals) if vals else None

    cached, prompts = overall_terms(counter, sources)
    return HitRates(
        share(counter(GPU_HITS), counter(GPU_QUERIES)),
        share(counter(EXT_HITS), counter(EXT_QUERIES)),
        share(cached, prompts),
    )
