"""`/metrics` in vLLM's exposition: same family names, types, HELP, labels, buckets and `_created` samples.

Rendered with prometheus_client (as vLLM does) from the engine's Stats at scrape time. Labels are
emitted sorted, as vLLM's multiprocess collector does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.samples import Sample

from simulator.engine import Engine

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"

HELP = {
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:external_prefix_cache_queries": "External prefix cache queries from KV connector cross-instance cache "
    "sharing, in terms of number of queried tokens.",
    "vllm:external_prefix_cache_hits": "External prefix cache hits from KV connector cross-instance cache "
    "sharing, in terms of number of cached tokens.",
    "vllm:mm_cache_queries": "Multi-modal cache queries, in terms of number of queried items.",
    "vllm:mm_cache_hits": "Multi-modal cache hits, in terms of number of cached items.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:prompt_tokens_by_source": "Number of prompt tokens by source.",
    "vllm:prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "vllm:prompt_tokens_cached_by_source": "Prefix-cache hit tokens by the cache tier that supplied them: device "
    "(local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
    "external_unspecified. Counted at admission.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:request_success": "Count of successfully processed requests.",
    "vllm:admission_rejections": "Number of admission attempts rejected by a queue limit, by reason.",
    "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
    "vllm:request_generation_tokens": "Number of generation tokens processed.",
    "vllm:iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "vllm:request_max_num_generation_tokens": "Histogram of maximum number of requested generation tokens.",
    "vllm:request_params_n": "Histogram of the n request parameter.",
    "vllm:request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "vllm:request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "vllm:request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "vllm:request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "vllm:request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "vllm:request_num_preemptions": "Histogram of the number of times a request was preempted.",
    "vllm:request_prefill_kv_computed_tokens": "Histogram of new KV tokens computed during prefill (excluding "
    "cached tokens).",
    "vllm:kv_offload_total_bytes": "Number of bytes offloaded by KV connector",
    "vllm:kv_offload_total_time": "Total time measured by all KV offloading operations",
    "vllm:kv_offload_size": "Histogram of KV offload transfer size, in bytes.",
    "vllm:kv_offload_load_bytes": "Total bytes loaded from offload storage to GPU.",
    "vllm:kv_offload_load_time": "Total load time from offload storage to GPU, in seconds.",
    "vllm:kv_offload_load_size": "Histogram of KV offload load operation size, in bytes.",
    "vllm:kv_offload_store_bytes": "Total bytes stored from GPU to offload storage.",
    "vllm:kv_offload_store_time": "Total store time from GPU to offload storage, in seconds.",
    "vllm:kv_offload_store_size": "Histogram of KV offload store operation size, in bytes.",
    "vllm:kv_offload_cpu_allocation_size": "Histogram of the number of CPU blocks requested by each KV offload "
    "prepare_store call.",
    "vllm:kv_offload_lookup_sync_delay_seconds": "Histogram of the time spent in a single offload lookup call, "
    "in seconds.",
    "vllm:kv_offload_lookup_async_delay_seconds": "Histogram of time between a request's offload lookup first "
    "deferring and the following lookup resolving, or request finish, in seconds.",
    "vllm:kv_offload_allocation_failure": "Number of KV offload store allocation attempts that failed.",
    "vllm:kv_offload_stores_skipped": "Number of KV offload stores skipped because the reuse threshold was not "
    "reached.",
}

GAUGE_HELP = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:num_requests_waiting_by_reason": "Number of waiting requests by reason. Reason labels: 'capacity' = "
    "waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
    "blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
    "vllm:engine_sleep_state": "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
    "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:kv_offload_cpu_cache_usage_perc": "Fraction of CPU KV-cache space currently pinned by active transfers "
    "(0.0 = idle, 1.0 = saturated). Sustained high values indicate transfers (stores or promotions) may be "
    "dropped due to insufficient capacity.",
    "vllm:kv_offload_cpu_cache_write_usage_perc": "Fraction of CPU KV-cache space currently pinned by in-flight "
    "stores that have not yet completed (0.0 = idle, 1.0 = saturated).",
    "vllm:kv_offload_cpu_cache_read_usage_perc": "Fraction of CPU KV-cache space currently pinned by in-flight "
    "loads that have not yet completed (0.0 = idle, 1.0 = saturated).",
}

# Families without an engine label (vLLM registers them on the API-server side).
NO_ENGINE_LABEL = {"vllm:admission_rejections"}


# --sim-metric-names legacy: the names older vLLM builds used (a compatibility view for the agent's
# normaliser, mixing what 0.9-0.14 exposed; not one exact release).
LEGACY_RENAMES = {
    "vllm:kv_cache_usage_perc": "vllm:gpu_cache_usage_perc",
    "vllm:prefix_cache_queries": "vllm:gpu_prefix_cache_queries",
    "vllm:prefix_cache_hits": "vllm:gpu_prefix_cache_hits",
    "vllm:inter_token_latency_seconds": "vllm:time_per_output_token_seconds",
}
LEGACY_ABSENT = {
    "vllm:prompt_tokens_by_source",
    "vllm:prompt_tokens_cached_by_source",
    "vllm:prompt_tokens_cached",
    "vllm:num_requests_waiting_by_reason",
    "vllm:admission_rejections",
    "vllm:kv_offload_load_bytes",
    "vllm:kv_offload_load_time",
    "vllm:kv_offload_load_size",
    "vllm:kv_offload_store_bytes",
    "vllm:kv_offload_store_time",
    "vllm:kv_offload_store_size",
    "vllm:kv_offload_config_info",
    "vllm:kv_offload_lookup_sync_delay_seconds",
    "vllm:kv_offload_lookup_async_delay_seconds",
    "vllm:kv_offload_cpu_cache_usage_perc",
    "vllm:kv_offload_cpu_cache_write_usage_perc",
    "vllm:kv_offload_cpu_cache_read_usage_perc",
    "vllm:kv_offload_cpu_allocation_size",
}


def legacy_view(fam: Metric) -> Metric | None:
    if fam.name in LEGACY_ABSENT or fam.name.startswith("vllm:kv_offload_tiering"):
        return None
    new = LEGACY_RENAMES.get(fam.name)
    if new is None:
        return fam
    out = Metric(new, fam.documentation, fam.type, fam.unit)
    out.samples = [s._replace(name=new + s.name[len(fam.name) :]) for s in fam.samples]
    return out


class EngineCollector:
    def __init__(self, engine: Engine, legacy_names: bool = False) -> None:
        self.engine = engine
        self.legacy_names = legacy_names

    def collect(self) -> Iterator[Metric]:
        for fam in self._collect():
            view = legacy_view(fam) if self.legacy_names else fam
            if view is not None:
                yield view

    def _base(self, name: str) -> dict[str, str]:
        base = {"model_name": self.engine.cfg.served_model_name}
        if name not in NO_ENGINE_LABEL:
            base["engine"] = "0"
        return base

    def _collect(self) -> Iterator[Metric]:
        e = self.engine
        st = e.stats
        g = e.gauges()
        base = self._base("")
        yield _gauge("vllm:num_requests_running", base, [({}, g["running"])])
        yield _gauge("vllm:num_requests_waiting", base, [({}, g["waiting_capacity"] + g["waiting_deferred"])])
        yield _gauge(
            "vllm:num_requests_waiting_by_reason",
            base,
            [({"reason": "capacity"}, g["waiting_capacity"]), ({"reason": "deferred"}, g["waiting_deferred"])],
        )
        yield _gauge(
            "vllm:engine_sleep_state",
            base,
            [
                ({"sleep_state": "awake"}, 1.0),
                ({"sleep_state": "weights_offloaded"}, 0.0),
                ({"sleep_state": "discard_all"}, 0.0),
            ],
        )
        yield _gauge("vllm:kv_cache_usage_perc", base, [({}, g["kv_cache_usage"])])
        for name, series in st.counters.items():
            if not name.startswith("vllm:kv_offload"):
                yield self._counter(name, series, st.created)
        for name, hists in st.histograms.items():
            if not name.startswith("vllm:kv_offload"):
                yield self._histogram(name, hists, st.created)
        yield _gauge(
            "vllm:cache_config_info",
            {},
            [(e.cfg.cache_config_labels(), 1.0)],
            "Information of the LLMEngine CacheConfig",
        )
        if e.native:
            for name, series in st.counters.items():
                if name.startswith("vllm:kv_offload"):
                    yield self._counter(name, series, st.created)
            for name, hists in st.histograms.items():
                if name.startswith("vllm:kv_offload"):
                    yield self._histogram(name, hists, st.created)
            yield _gauge("vllm:kv_offload_cpu_cache_usage_perc", base, [({}, g["cpu_usage"])])
            yield _gauge("vllm:kv_offload_cpu_cache_write_usage_perc", base, [({}, g["cpu_write_usage"])])
            yield _gauge("vllm:kv_offload_cpu_cache_read_usage_perc", base, [({}, g["cpu_read_usage"])])
            labels = e.cfg.offload_config_labels()
            if labels is not None and e.offload_config_emitted:  # absent before the first step, like vLLM
                yield _gauge(
                    "vllm:kv_offload_config_info", {}, [(labels, 1.0)], "Configuration of the KV offloading CPU tier."
                )

    def _counter(self, name: str, series: dict[Any, float], created: float) -> Metric:
        base = self._base(name)
        keys = sorted({*base, *(k for key in series for k, _ in key)})
        fam = CounterMetricFamily(name, HELP.get(name, ""), labels=keys)
        for key, value in series.items():
            lv = {**base, **dict(key)}
            fam.add_metric([lv[k] for k in keys], value, created=created)
        return fam

    def _histogram(self, name: str, hists: dict[Any, Any], created: float) -> Metric:
        base = self._base(name)
        keys = sorted({*base, *(k for key in hists for k, _ in key)})
        fam = HistogramMetricFamily(name, HELP.get(name, ""), labels=keys)
        for key, h in hists.items():
            lv = {**base, **dict(key)}
            fam.add_metric([lv[k] for k in keys], h.cumulative(), h.total)
            fam.samples.append(Sample(name + "_created", {k: lv[k] for k in keys}, created))
        return fam


def _gauge(
    name: str, base: dict[str, str], series: list[tuple[dict[str, str], float]], help_text: str | None = None
) -> Metric:
    keys = sorted({*base, *(k for labels, _ in series for k in labels)})
    fam = GaugeMetricFamily(name, help_text if help_text is not None else GAUGE_HELP.get(name, ""), labels=keys)
    for labels, value in series:
        lv = {**base, **labels}
        fam.add_metric([lv[k] for k in keys], value)
    return fam


def build_registry(engine: Engine, legacy_names: bool = False) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    GCCollector(registry=reg)
    PlatformCollector(registry=reg)
    ProcessCollector(registry=reg)
    reg.register(EngineCollector(engine, legacy_names))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
