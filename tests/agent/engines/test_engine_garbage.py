"""Any samples under an engine's prefixes, however odd, give finite normalised series and no
exception: readers are fed what a broken or unknown build might expose."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.engines import ENGINES, read_engines
from agent.engines.kv_series import FAMILY_TYPES, family_type

KNOWN = [
    "sglang:prefill_effective_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:prompt_tokens_total",
    "sglang:load_back_tokens_total",
    "sglang:max_total_num_tokens",
    "sglang:kv_used_tokens",
    "sglang:page_size",
    "sglang:time_to_first_token_seconds_bucket",
    "trtllm_kv_cache_reused_blocks_total",
    "trtllm_kv_cache_tokens_per_block",
    "trtllm_prompt_cache_hit_tokens_total",
    "trtllm_prompt_tokens_total",
    "trtllm:kv_cache_max_blocks",
    "kvbm_offload_blocks_d2h",
    "kvbm_onboard_blocks_h2d",
    "kvbm_host_cache_hit_rate",
    "lmcache:num_lookup_tokens_total",
    "lmcache:lookup_hit_rate",
    "vllm:kv_offload_tiering_chunk_queries_total",
    "vllm:kv_offload_load_bytes_total",
]
labels = st.dictionaries(
    st.sampled_from(["mode", "cache_source", "cache_tier", "cache_level", "tp_rank", "tier", "le", "x"]),
    st.text(max_size=8),
    max_size=3,
)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -1.0, 1e308, 32.0, 0.5]),
)
samples = st.lists(st.tuples(st.sampled_from(KNOWN), labels, values), max_size=30)


@settings(max_examples=300, deadline=None)
@given(samples, st.sampled_from([None, *ENGINES]), st.sampled_from([None, 1, 16, 1 << 20]))
def test_odd_samples_never_crash_a_reader_nor_give_non_finite_values(
    rows: list[tuple[str, dict[str, str], float]], override: str | None, block_size: int | None
) -> None:
    reading = read_engines(rows, override=override, block_size=block_size)
    types = reading.types
    for name, lab, value in reading.samples:
        assert math.isfinite(value), (name, lab)
        assert "kv_engine" in lab
        assert family_type(name) in types or name in types or name in FAMILY_TYPES
