"""Simulator personalities: the same cost model's /metrics in another engine's families.

``kvscope sim --sim-engine sglang|trtllm`` (SIMULATED, labelled so): the simulated vLLM engine runs
unchanged; at each scrape its vLLM families are collected and re-expressed as the families the
other engine exports (names, types and labels as agent/engines reads them; see docs/engines.md),
so a demo can show one instance of each engine and the tests drive every engine reader end to
end. Only what the other engine exports is written (SGLang: tokens per tier, HiCache traffic and
pools; TensorRT-LLM: tokens per KV level, block reuse in blocks, onboard/offload bytes, block pool).

The numbers are the simulator's: the CPU tier plays SGLang's host pool (L2) and TensorRT-LLM's
host level, a disk tier SGLang's storage (L3) and TensorRT-LLM's disk level.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

PERSONALITIES = ("vllm", "sglang", "trtllm")
GIB = float(2**30)

Rows = dict[str, list[tuple[dict[str, str], float]]]


def _rows(metrics: Iterable[Metric]) -> Rows:
    out: Rows = {}
    for m in metrics:
        for s in m.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _sum(rows: Rows, name: str, **match: str) -> float:
    return sum(v for labels, v in rows.get(name, []) if all(labels.get(k) == w for k, w in match.items()))


def _cache_config(rows: Rows) -> dict[str, str]:
    for labels, _v in rows.get("vllm:cache_config_info", []):
        return labels
    return {}


def _num(raw: str | None) -> float | None:
    try:
        v = float(str(raw))
    except ValueError:
        return None
    return v if v == v and v > 0 else None


def _ttft(rows: Rows, name: str, labels: dict[str, str]) -> HistogramMetricFamily | None:
    buckets: dict[str, float] = {}
    for lab, v in rows.get("vllm:time_to_first_token_seconds_bucket", []):
        buckets[lab.get("le", "+Inf")] = buckets.get(lab.get("le", "+Inf"), 0.0) + v
    if not buckets:
        return None
    fam = HistogramMetricFamily(name, "Histogram of time to first token in seconds.", labels=list(labels))
    ordered = sorted(buckets.items(), key=lambda kv: float("inf") if kv[0] == "+Inf" else float(kv[0]))
    fam.add_metric(list(labels.values()), ordered, _sum(rows, "vllm:time_to_first_token_seconds_sum"))
    return fam


def _counter(name: str, help_text: str, labels: dict[str, str], value: float) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, help_text, labels=list(labels))
    fam.add_metric(list(labels.values()), value)
    return fam


def _gauge(name: str, help_text: str, labels: dict[str, str], value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, help_text, labels=list(labels))
    fam.add_metric(list(labels.values()), value)
    return fam


def sglang_families(rows: Rows) -> Iterator[Metric]:
    cfg = _cache_config(rows)
    model = next((lab.get("model_name", "") for lab, _v in rows.get("vllm:prompt_tokens_total", [])), "")
    sched = {"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    tok = {"model_name": model, "engine_type": "unified"}
    radix = {"cache_type": "HiRadixCache", "tp_rank": "0", "pp_rank": "0", "dp_rank": "0"}
    by = "vllm:prompt_tokens_by_source_total"
    compute, gpu, ext = (_sum(rows, by, source=s) for s in ("local_compute", "local_cache_hit", "external_kv_transfer"))
    cached_by = "vllm:prompt_tokens_cached_by_source_total"
    disk = _sum(rows, cached_by, source="disk")
    host = ext - disk
    eff = CounterMetricFamily(
        "sglang:prefill_effective_tokens", "Effective prefill tokens (SIMULATED).", labels=[*sched, "mode"]
    )
    for mode, value in (("input", compute), ("device_hit", gpu), ("host_hit", host), ("storage_hit", disk)):
        eff.add_metric([*sched.values(), mode], value)
    yield eff
    prompt = CounterMetricFamily(
        "sglang:prompt_tokens", "Number of prefill tokens processed.", labels=[*tok, "is_streaming"]
    )
    prompt.add_metric([*tok.values(), "false"], _sum(rows, "vllm:prompt_tokens_total"))
    yield prompt
    cached = CounterMetricFamily(
        "sglang:cached_tokens", "Cached prompt tokens by source.", labels=[*tok, "cache_source"]
    )
    for src, value in (("device", gpu), ("host", host), ("storage", disk)):
        if value > 0:
            cached.add_metric([*tok.values(), src], value)
    yield cached
    if "vllm:kv_offload_load_bytes_total" in rows:
        yield _counter(
            "sglang:load_back_bytes",
            "Bytes loaded back host -> GPU.",
            radix,
            _sum(rows, "vllm:kv_offload_load_bytes_total"),
        )
        yield _counter(
            "sglang:hicache_backup_bytes",
            "Bytes backed up GPU -> host.",
            radix,
            _sum(rows, "vllm:kv_offload_store_bytes_total"),
        )
        for name, size, secs in (
            ("sglang:load_back_duration_seconds", "vllm:kv_offload_load_size_count", "vllm:kv_offload_load_time_total"),
            (
                "sglang:hicache_backup_duration_seconds",
                "vllm:kv_offload_store_size_count",
                "vllm:kv_offload_store_time_total",
            ),
        ):
            fam = HistogramMetricFamily(name, "Transfer duration (SIMULATED: one bucket).", labels=list(radix))
            fam.add_metric(list(radix.values()), [("+Inf", _sum(rows, size))], _sum(rows, secs))
            yield fam
        yield _counter("sglang:load_back_tokens", "Tokens loaded back host -> GPU.", {**radix, "pool": "kv"}, host)
    block = _num(cfg.get("block_size"))
    gpu_tokens = _num(cfg.get("kv_cache_size_tokens"))
    if gpu_tokens is None and block is not None and _num(cfg.get("num_gpu_blocks")) is not None:
        gpu_tokens = block * (_num(cfg.get("num_gpu_blocks")) or 0.0)
    if gpu_tokens is not None:
        yield _gauge(
            "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", sched, gpu_tokens
        )
        usage = _sum(rows, "vllm:kv_cache_usage_perc")
        yield _gauge("sglang:kv_used_tokens", "KV slots held by running requests.", sched, usage * gpu_tokens)
        offload = _num(cfg.get("kv_offloading_size"))
        mem = _num(cfg.get("kv_cache_memory_bytes"))
        if offload is not None and mem is not None:
            yield _gauge(
                "sglang:hicache_host_total_tokens",
                "Host KV cache capacity in tokens.",
                sched,
                offload * GIB / (mem / gpu_tokens),
            )
    if block is not None:
        yield _gauge("sglang:page_size", "KV cache page size in tokens.", sched, block)
    total = _sum(rows, "vllm:prompt_tokens_total")
    if total > 0:
        yield _gauge(
            "sglang:cache_hit_rate", "The prefix cache hit rate (SIMULATED: cumulative).", sched, (gpu + ext) / total
        )
    yield _gauge(
        "sglang:num_running_reqs", "The number of running requests.", sched, _sum(rows, "vllm:num_requests_running")
    )
    yield _gauge(
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue.",
        sched,
        _sum(rows, "vllm:num_requests_waiting"),
    )
    ttft = _ttft(rows, "sglang:time_to_first_token_seconds", {**tok, "is_streaming": "false"})
    if ttft is not None:
        yield ttft


def trtllm_families(rows: Rows) -> Iterator[Metric]:
    cfg = _cache_config(rows)
    model = next((lab.get("model_name", "") for lab, _v in rows.get("vllm:prompt_tokens_total", [])), "")
    lab = {"model_name": model, "engine_type": "trtllm"}
    by = "vllm:prompt_tokens_by_source_total"
    gpu, ext = _sum(rows, by, source="local_cache_hit"), _sum(rows, by, source="external_kv_transfer")
    disk = _sum(rows, "vllm:prompt_tokens_cached_by_source_total", source="disk")
    prompt = _sum(rows, "vllm:prompt_tokens_total")
    yield _counter("trtllm_prompt_tokens", "Cumulative number of prompt (input) tokens processed.", lab, prompt)
    yield _counter("trtllm_prompt_cached_tokens", "Prompt tokens served from KV cache.", lab, gpu + ext)
    level = CounterMetricFamily(
        "trtllm_prompt_cache_hit_tokens",
        "Prompt tokens served from each KV level.",
        labels=[*lab, "cache_level", "cache_tier"],
    )
    for i, (tier, value) in enumerate((("gpu", gpu), ("host", ext - disk), ("disk", disk))):
        if i < 2 or value > 0:
            level.add_metric([*lab.values(), str(i), tier], value)
    yield level
    block = _num(cfg.get("block_size"))
    if block is not None:
        hits = _sum(rows, "vllm:prefix_cache_hits_total") + ext
        queries = _sum(rows, "vllm:prefix_cache_queries_total")
        yield _counter("trtllm_kv_cache_reused_blocks", "KV cache blocks reused.", lab, hits // block)
        yield _counter(
            "trtllm_kv_cache_missed_blocks", "KV cache blocks missed.", lab, max(0.0, queries - hits) // block
        )
        yield _gauge("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block", lab, block)
        blocks = _num(cfg.get("num_gpu_blocks"))
        if blocks is not None:
            used = round(_sum(rows, "vllm:kv_cache_usage_perc") * blocks)
            yield _gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", lab, blocks)
            yield _gauge("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks", lab, used)
            yield _gauge("trtllm_kv_cache_free_blocks", "Number of free KV cache blocks", lab, blocks - used)
            yield _gauge("trtllm_kv_cache_utilization", "KV cache utilization", lab, used / blocks)
        if queries > 0:
            yield _gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate", lab, min(1.0, hits / queries))
    if "vllm:kv_offload_load_bytes_total" in rows:
        yield _counter(
            "trtllm_kv_cache_onboard_bytes_total",
            "Bytes host -> GPU.",
            lab,
            _sum(rows, "vllm:kv_offload_load_bytes_total"),
        )
        yield _counter(
            "trtllm_kv_cache_offload_bytes_total",
            "Bytes GPU -> host.",
            lab,
            _sum(rows, "vllm:kv_offload_store_bytes_total"),
        )
    yield _gauge(
        "trtllm_num_requests_running", "Number of active requests", lab, _sum(rows, "vllm:num_requests_running")
    )
    yield _gauge(
        "trtllm_num_requests_waiting", "Number of queued requests", lab, _sum(rows, "vllm:num_requests_waiting")
    )
    ttft = _ttft(rows, "trtllm_time_to_first_token_seconds", lab)
    if ttft is not None:
        yield ttft


FAMILIES = {"sglang": sglang_families, "trtllm": trtllm_families}
# where each personality serves its Prometheus text (trtllm-serve: /metrics answers JSON)
METRICS_PATHS = {"vllm": "/metrics", "sglang": "/metrics", "trtllm": "/prometheus/metrics"}


def trtllm_iteration_stats(registry: CollectorRegistry) -> list[dict[str, object]]:
    """trtllm-serve's JSON /metrics: the latest iteration's statistics (kvCacheStats and queue
    sizes), from the TensorRT-LLM families of ``registry`` (a trtllm personality)."""
    rows = _rows(registry.collect())

    def g(name: str) -> float:
        return _sum(rows, name)

    kv = {
        "maxNumBlocks": int(g("trtllm_kv_cache_max_blocks")),
        "freeNumBlocks": int(g("trtllm_kv_cache_free_blocks")),
        "usedNumBlocks": int(g("trtllm_kv_cache_used_blocks")),
        "tokensPerBlock": int(g("trtllm_kv_cache_tokens_per_block")),
        "reusedBlocks": int(g("trtllm_kv_cache_reused_blocks_total")),
        "missedBlocks": int(g("trtllm_kv_cache_missed_blocks_total")),
        "cacheHitRate": g("trtllm_kv_cache_hit_rate"),
    }
    return [
        {
            "numActiveRequests": int(g("trtllm_num_requests_running")),
            "numQueuedRequests": int(g("trtllm_num_requests_waiting")),
            "kvCacheStats": kv,
        }
    ]


class PersonalityCollector(Collector):
    """Collects the vLLM registry and yields the other engine's families (plus process_*)."""

    def __init__(self, source: CollectorRegistry, engine: str) -> None:
        self.source = source
        self.families = FAMILIES[engine]

    def collect(self) -> Iterator[Metric]:
        metrics = list(self.source.collect())
        yield from (m for m in metrics if m.name.startswith("process_"))
        yield from self.families(_rows(metrics))


def personality_registry(source: CollectorRegistry, engine: str) -> CollectorRegistry:
    """``source`` itself for vLLM; else a registry that renders it as ``engine``."""
    if engine == "vllm":
        return source
    if engine not in FAMILIES:
        raise ValueError(f"unknown simulator engine {engine!r}; known: {', '.join(PERSONALITIES)}")
    reg = CollectorRegistry(auto_describe=False)
    reg.register(PersonalityCollector(source, engine))
    return reg
