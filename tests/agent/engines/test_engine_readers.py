"""Each engine reader's own rules: fallbacks, ranks, conversions, and tolerance of garbage."""

from __future__ import annotations

import math
from pathlib import Path

from agent.engines import kvbm, lmcache, sglang, trtllm, vllm_tiering
from agent.engines.kv_series import (
    TIER_HIT_TOKENS,
    TIER_LOOKUP_TOKENS,
    TIER_TRANSFER_BLOCKS,
    TIER_TRANSFER_TOKENS,
    Derived,
)
from kvcore.exposition import parse

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"


def values(d: Derived, name: str, **match: str) -> list[float]:
    return [v for n, labels, v in d.samples if n == name and all(labels.get(k) == w for k, w in match.items())]


def test_sglang_without_effective_tokens_splits_sources_from_the_tokenizer_and_keeps_total_apart() -> None:
    samples = [
        ("sglang:prompt_tokens_total", {"is_streaming": "false"}, 900.0),
        ("sglang:prompt_tokens_total", {"is_streaming": "true"}, 100.0),
        ("sglang:cached_tokens_total", {"cache_source": "device"}, 300.0),
        ("sglang:cached_tokens_total", {"cache_source": "host"}, 200.0),
        ("sglang:cached_tokens_total", {"cache_source": "total"}, 50.0),  # a request without detail
    ]
    d = sglang.read(samples)
    assert values(d, BY_SOURCE, source="local_cache_hit") == [300.0]
    assert values(d, BY_SOURCE, source="external_kv_transfer", tier="CPU") == [200.0]
    assert values(d, BY_SOURCE, source="cached_unattributed") == [50.0]  # never added to a tier
    assert values(d, BY_SOURCE, source="local_compute") == [1000.0 - 550.0]
    assert sum(values(d, BY_SOURCE)) == 1000.0
    assert values(d, "vllm:prompt_tokens_cached_total") == [550.0]


def test_sglang_token_counters_repeated_by_every_tp_rank_are_read_once_and_bytes_are_summed() -> None:
    rank = {"cache_type": "HiRadixCache", "pool": "kv", "dp_rank": "0"}
    samples = [
        ("sglang:load_back_tokens_total", {**rank, "tp_rank": "1"}, 640.0),
        ("sglang:load_back_tokens_total", {**rank, "tp_rank": "0"}, 640.0),
        ("sglang:load_back_bytes_total", {"tp_rank": "0"}, 1000.0),
        ("sglang:load_back_bytes_total", {"tp_rank": "1"}, 1000.0),
    ]
    d = sglang.read(samples)
    assert values(d, TIER_TRANSFER_TOKENS, direction="load") == [640.0]
    assert values(d, "vllm:kv_offload_load_bytes_total") == [2000.0]


def test_sglang_reader_survives_garbage_and_missing_families() -> None:
    samples = [
        ("sglang:prefill_effective_tokens_total", {"mode": "input", "tp_rank": "x"}, float("nan")),
        ("sglang:prefill_effective_tokens_total", {"mode": "weird"}, 5.0),
        ("sglang:max_total_num_tokens", {}, float("inf")),
        ("sglang:kv_used_tokens", {}, 10.0),
    ]
    d = sglang.read(samples)
    assert all(math.isfinite(v) for _n, _l, v in d.samples)
    assert not values(d, "vllm:kv_cache_usage_perc")  # no capacity, no ratio
    assert sglang.read([]).samples == []


def test_trtllm_block_counters_are_converted_only_with_a_block_size_and_say_so() -> None:
    samples = [
        ("trtllm:kv_cache_reused_blocks_total", {}, 10.0),
        ("trtllm:kv_cache_missed_blocks_total", {}, 30.0),
        ("trtllm:kv_cache_disk_prefetch_blocks_total", {}, 4.0),
    ]
    without = trtllm.read(samples, None)
    assert not values(without, TIER_LOOKUP_TOKENS)
    assert values(without, TIER_TRANSFER_BLOCKS, tier="disk") == [4.0]
    with_bs = trtllm.read(samples, 64)
    assert values(with_bs, TIER_LOOKUP_TOKENS, converted="blocks", block_size="64") == [40.0 * 64]
    assert values(with_bs, TIER_HIT_TOKENS, converted="blocks") == [10.0 * 64]
    assert values(with_bs, TIER_TRANSFER_TOKENS, tier="disk", converted="blocks") == [4.0 * 64]


def test_trtllm_json_iteration_stats_become_its_collector_samples_from_the_newest_record() -> None:
    payload = [
        {"iter": 1, "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 10, "reusedBlocks": 1}},
        {
            "iter": 2,
            "numActiveRequests": 3,
            "pinnedMemUsage": 2048,
            "kvCacheStats": {
                "maxNumBlocks": 100,
                "usedNumBlocks": 25,
                "freeNumBlocks": 75,
                "tokensPerBlock": 32,
                "reusedBlocks": 7,
                "missedBlocks": 13,
                "cacheHitRate": 0.35,
            },
        },
    ]
    got = {n: v for n, _l, v in trtllm.iteration_samples(payload)}
    assert got["trtllm_kv_cache_reused_blocks_total"] == 7 and got["trtllm_kv_cache_utilization"] == 0.25
    assert got["trtllm_kv_cache_tokens_per_block"] == 32 and got["trtllm_num_requests_running"] == 3
    d = trtllm.read(trtllm.iteration_samples(payload), 32)
    assert values(d, TIER_LOOKUP_TOKENS) == [20.0 * 32]


def test_trtllm_json_garbage_gives_nothing() -> None:
    for payload in (None, {}, "x", [1, "a"], [{"kvCacheStats": {"maxNumBlocks": "many", "reusedBlocks": True}}]):
        assert trtllm.iteration_samples(payload) == []
    big = [{"kvCacheStats": {"maxNumBlocks": 1}}] * (trtllm.MAX_ITERATIONS + 50)
    assert trtllm.iteration_samples(big) == [("trtllm_kv_cache_max_blocks", {}, 1.0)]


def test_kvbm_blocks_become_tokens_with_an_operators_block_size_and_say_so() -> None:
    text = (FIXTURES / "dynamo-kvbm" / "documented__kvbm-1.6.1__host-and-disk.prom").read_text()
    samples = parse(text).samples
    d = kvbm.read(samples, 16)
    assert values(d, TIER_TRANSFER_TOKENS, path="CPU->GPU", converted="blocks", block_size="16") == [310.0 * 16]
    assert not values(d, TIER_TRANSFER_BLOCKS)


def test_lmcache_sums_its_workers_and_averages_their_interval_rates() -> None:
    w0, w1 = {"worker_id": "0"}, {"worker_id": "1"}
    samples = [
        ("lmcache:num_lookup_tokens_total", w0, 100.0),
        ("lmcache:num_lookup_tokens_total", w1, 300.0),
        ("lmcache:num_lookup_hits_total", w0, 50.0),
        ("lmcache:num_lookup_hits_total", w1, 150.0),
        ("lmcache:lookup_hit_rate", w0, 0.2),
        ("lmcache:lookup_hit_rate", w1, 0.6),
    ]
    d = lmcache.read(samples)
    assert values(d, TIER_LOOKUP_TOKENS, tier="LMCache") == [400.0]
    assert values(d, TIER_HIT_TOKENS, tier="LMCache") == [200.0]
    assert values(d, "kvscope:kv_engine_hit_rate")[0] == 0.4


def test_vllm_tiering_reads_chunk_or_block_names_never_both_and_names_tiers() -> None:
    both = [
        ("vllm:kv_offload_tiering_chunk_queries_total", {"tier": "1:fs"}, 10.0),
        ("vllm:kv_offload_tiering_block_queries_total", {"tier": "1:fs"}, 10.0),
        ("vllm:kv_offload_tiering_block_queries_total", {"tier": "2:obj"}, 3.0),
    ]
    d = vllm_tiering.read(both)
    assert values(d, "kvscope:kv_tier_lookup_blocks_total", tier="disk") == [10.0]
    older = vllm_tiering.read(both[1:])
    assert values(older, "kvscope:kv_tier_lookup_blocks_total", tier="object store") == [3.0]
    assert vllm_tiering.tier_name("0:primary") == "CPU" and vllm_tiering.tier_name("1:p2p") == "p2p"
