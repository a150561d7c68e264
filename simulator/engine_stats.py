"""What the engine records, and when: declared families and the per-request observations.

Prompt-token accounting happens at the first token (the iteration that finishes the prefill), so
`local_compute + local_cache_hit + external_kv_transfer == prompt_tokens` holds at every scrape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator import stats as S
from simulator.config import EngineConfig

if TYPE_CHECKING:
    from simulator.request import SimRequest

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def declare_families(st: S.Stats, cfg: EngineConfig) -> None:
    for name in (
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:external_prefix_cache_queries",
        "vllm:external_prefix_cache_hits",
        "vllm:mm_cache_queries",
        "vllm:mm_cache_hits",
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:prompt_tokens_cached",
        "vllm:generation_tokens",
    ):
        st.declare_counter(name, {})
    st.declare_counter("vllm:prompt_tokens_by_source", *({"source": s} for s in SOURCES))
    st.declare_counter("vllm:prompt_tokens_cached_by_source", *({"source": s} for s in CACHED_SOURCES))
    st.declare_counter("vllm:request_success", *({"finished_reason": r} for r in FINISHED_REASONS))
    st.declare_counter(
        "vllm:admission_rejections", {"reason": "max_num_queued_reqs"}, {"reason": "max_num_queued_tokens"}
    )
    len_buckets = S.build_1_2_5_buckets(cfg.max_model_len)
    for name in (
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_params_max_tokens",
        "vllm:request_prefill_kv_computed_tokens",
    ):
        st.declare_histogram(name, len_buckets, {})
    st.declare_histogram("vllm:iteration_tokens_total", S.ITERATION_TOKENS_BUCKETS, {})
    st.declare_histogram("vllm:request_params_n", S.PARAMS_N_BUCKETS, {})
    st.declare_histogram("vllm:time_to_first_token_seconds", S.TTFT_BUCKETS, {})
    st.declare_histogram("vllm:inter_token_latency_seconds", S.ITL_BUCKETS, {})
    st.declare_histogram("vllm:request_time_per_output_token_seconds", S.ITL_BUCKETS, {})
    for name in (
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
    ):
        st.declare_histogram(name, S.REQUEST_TIME_BUCKETS, {})
    st.declare_histogram("vllm:request_num_preemptions", S.PREEMPTION_BUCKETS, {})

    o = cfg.offload
    if o is None or o.backend != "native":
        return
    for name in (
        "vllm:kv_offload_load_bytes",
        "vllm:kv_offload_load_time",
        "vllm:kv_offload_store_bytes",
        "vllm:kv_offload_store_time",
    ):
        st.declare_counter(name, {})
    both = ({"transfer_type": "CPU_to_GPU"}, {"transfer_type": "GPU_to_CPU"})
    st.declare_counter("vllm:kv_offload_total_bytes", *both)
    st.declare_counter("vllm:kv_offload_total_time", *both)
    st.declare_counter("vllm:kv_offload_allocation_failure")  # no sample until the first failure
    st.declare_histogram("vllm:kv_offload_size", S.OFFLOAD_SIZE_BUCKETS, *both)
    st.declare_histogram("vllm:kv_offload_load_size", S.OFFLOAD_SIZE_BUCKETS, {})
    st.declare_histogram("vllm:kv_offload_store_size", S.OFFLOAD_SIZE_BUCKETS, {})
    st.declare_histogram("vllm:kv_offload_cpu_allocation_size", S.CPU_ALLOC_BUCKETS, {})
    st.declare_histogram("vllm:kv_offload_lookup_sync_delay_seconds", S.LOOKUP_SYNC_BUCKETS, {})
    st.declare_histogram("vllm:kv_offload_lookup_async_delay_seconds", S.LOOKUP_ASYNC_BUCKETS)
    if o.store_threshold >= 2:
        st.declare_counter("vllm:kv_offload_stores_skipped", {})
    if o.spec_name == "TieringOffloadingSpec":
        tiers = [{"tier": "0:primary"}] + [{"tier": f"{i}:{t.type}"} for i, t in enumerate(o.secondary_tiers, 1)]
        lower = tiers[1:]
        st.declare_counter("vllm:kv_offload_tiering_block_queries", *tiers)
        st.declare_counter("vllm:kv_offload_tiering_block_hits", *tiers)
        for name in (
            "vllm:kv_offload_tiering_read_bytes",
            "vllm:kv_offload_tiering_read_time",
            "vllm:kv_offload_tiering_write_bytes",
            "vllm:kv_offload_tiering_write_time",
            "vllm:kv_offload_tiering_promotion_job_failures",
            "vllm:kv_offload_tiering_cascade_job_failures",
        ):
            st.declare_counter(name, *lower)
        st.declare_counter("vllm:kv_offload_tiering_promotion_allocation_failures", {})
        st.declare_histogram("vllm:kv_offload_tiering_lookup_sync_delay_seconds", S.LOOKUP_SYNC_BUCKETS)
        st.declare_histogram("vllm:kv_offload_tiering_lookup_async_delay_seconds", S.LOOKUP_ASYNC_BUCKETS)


def record_first_token(st: S.Stats, cfg: EngineConfig, r: SimRequest) -> None:
    assert r.first_token_at is not None and r.scheduled_at is not None
    ext_host = r.ext_tokens - r.ext_disk_tokens
    st.inc("vllm:prompt_tokens", r.prompt_len)
    st.inc("vllm:prompt_tokens_by_source", r.computed_tokens, source="local_compute")
    st.inc("vllm:prompt_tokens_by_source", r.gpu_hit_tokens, source="local_cache_hit")
    st.inc("vllm:prompt_tokens_by_source", r.ext_tokens, source="external_kv_transfer")
    st.inc("vllm:prompt_tokens_cached", r.gpu_hit_tokens + r.ext_tokens)
    st.inc("vllm:prompt_tokens_cached_by_source", r.gpu_hit_tokens, source="device")
    if cfg.offload is not None and cfg.offload.backend == "lmcache":
        st.inc("vllm:prompt_tokens_cached_by_source", r.ext_tokens, source="external_unspecified")
    else:
        st.inc("vllm:prompt_tokens_cached_by_source", ext_host, source="host")
        st.inc("vllm:prompt_tokens_cached_by_source", r.ext_disk_tokens, source="disk")
    st.inc("vllm:external_prefix_cache_hits", r.ext_tokens)
    st.observe("vllm:time_to_first_token_seconds", r.first_token_at - r.arrival)
    st.observe("vllm:request_prefill_kv_computed_tokens", r.computed_tokens)
    st.observe("vllm:iteration_tokens_total", r.computed_tokens)


def record_finish(st: S.Stats, cfg: EngineConfig, r: SimRequest) -> None:
    assert r.finished_at is not None and r.first_token_at is not None and r.scheduled_at is not None
    n_out = len(r.token_times)
    st.inc("vllm:request_success", 1, finished_reason=r.finish_reason or "length")
    st.observe("vllm:request_prompt_tokens", r.prompt_len)
    st.observe("vllm:request_generation_tokens", n_out)
    st.observe("vllm:request_max_num_generation_tokens", r.max_tokens)
    st.observe("vllm:request_params_max_tokens", r.max_tokens)
    st.observe("vllm:request_params_n", r.n)
    st.observe("vllm:e2e_request_latency_seconds", r.finished_at - r.arrival)
    st.observe("vllm:request_queue_time_seconds", r.scheduled_at - r.enqueued_at)
    st.observe("vllm:request_inference_time_seconds", r.finished_at - r.scheduled_at)
    st.observe("vllm:request_prefill_time_seconds", r.first_token_at - r.scheduled_at)
    st.observe("vllm:request_decode_time_seconds", r.finished_at - r.first_token_at)
    st.observe("vllm:request_num_preemptions", r.preemptions)
    for a, b in zip(r.token_times, r.token_times[1:], strict=False):
        st.observe("vllm:inter_token_latency_seconds", b - a)
    if n_out > 1:
        st.observe("vllm:request_time_per_output_token_seconds", (r.finished_at - r.first_token_at) / (n_out - 1))
