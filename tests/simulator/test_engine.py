"""The engine driven with explicit time: queueing, pool pressure, tiers, failure modes."""

from __future__ import annotations

import json
from pathlib import Path

from simulator.engine import Engine
from tests.simulator.simdrive import doc_ids, engine, run, settle


def test_concurrent_prefills_share_engine_steps_first_come_first_served() -> None:
    e = engine("--profile", "rtx4070-qwen3-4b")
    run(e, doc_ids(99, 10), 1)  # warm-up
    alone = run(e, doc_ids(1, 3000), 1)
    t = e.t + 1
    a = e.submit("a", doc_ids(2, 3000), 1, t)
    b = e.submit("b", doc_ids(3, 3000), 1, t)
    settle(e)
    assert alone.ttft is not None and a.ttft is not None and b.ttft is not None
    rate = e.p.prefill_tokens_per_s
    # chunked prefill, budget 2048 per step: [a 2048] [a 952 + b 1096] [b 1904]
    assert abs((a.ttft - alone.ttft) - (2 * 2048 - 3000) / rate) < 1e-6
    assert abs((b.ttft - alone.ttft) - 3000 / rate) < 1e-6  # b waited for all of a's prefill


def test_decode_steps_stretch_while_a_long_prompt_prefills() -> None:
    e = engine("--profile", "rtx4070-qwen3-4b")
    run(e, doc_ids(99, 10), 1)
    t = e.t + 1
    d = e.submit("d", doc_ids(1, 100), 40, t)
    e.advance(t + 0.2)  # d is decoding
    e.submit("long", doc_ids(2, 6000), 1, t + 0.2)
    settle(e)
    gaps = [b - a for a, b in zip(d.token_times, d.token_times[1:], strict=False)]
    itl = e.p.itl_s * (1 + e.p.itl_batch_slowdown)
    assert min(gaps) >= e.p.itl_s - 1e-9
    assert max(gaps) >= itl + 2000 / e.p.prefill_tokens_per_s  # a step carrying a prefill chunk
    assert e.stats.histograms["vllm:inter_token_latency_seconds"][()].total == d.token_times[-1] - d.token_times[0]


def test_requests_queue_when_the_pool_is_full() -> None:
    e = engine(
        "--profile", "laptop8gb-qwen3-reranker-0.6b", "--kv-cache-memory-bytes", "268435456", "--max-model-len", "2048"
    )
    run(e, doc_ids(99, 10), 1)  # warm-up
    t = e.t + 1
    a = e.submit("a", doc_ids(1, 1500), 100, t)
    b = e.submit("b", doc_ids(2, 1500), 100, t)
    e.advance(t + 0.03)  # past the front-end overhead
    g = e.gauges()
    assert g["running"] == 1 and g["waiting_capacity"] == 1  # b does not fit beside a
    assert e.pool.usage() > 0.6
    settle(e)
    assert a.finished_at is not None and b.scheduled_at is not None
    assert b.scheduled_at >= a.finished_at - 1e-9  # b waited for a's blocks
    assert e.stats.histograms["vllm:request_queue_time_seconds"][()].total > 0.5
    assert e.pool.usage() == 0.0


def test_decode_blocks_are_allocated_lazily_and_a_full_pool_preempts() -> None:
    e = engine(
        "--profile", "laptop8gb-qwen3-reranker-0.6b", "--kv-cache-memory-bytes", "268435456", "--max-model-len", "2048"
    )
    run(e, doc_ids(99, 10), 1)  # warm-up
    t = e.t + 1
    reqs = [e.submit(f"q{i}", doc_ids(i, 400), 1500, t) for i in range(4)]
    e.advance(t + 0.2)
    assert e.gauges()["running"] == 4  # max_tokens is not reserved up front, as in vLLM
    settle(e)
    assert all(len(r.token_times) == 1500 and r.finish_reason == "length" for r in reqs)
    preempted = sum(r.preemptions for r in reqs)
    assert preempted >= 1 and e.stats.get("vllm:num_preemptions") == preempted
    assert e.stats.histograms["vllm:request_num_preemptions"][()].total == preempted
    assert e.pool.num_free == e.pool.num_blocks
    # the victims were the most recently scheduled; the oldest request never lost its blocks
    assert reqs[0].preemptions == 0


def test_prefix_caching_off_never_hits() -> None:
    e = engine("--profile", "tiny", "--no-enable-prefix-caching")
    run(e, doc_ids(1, 500))
    r = run(e, doc_ids(1, 500))
    assert r.gpu_hit_tokens == 0 and e.stats.get("vllm:prefix_cache_hits") == 0


def test_store_threshold_skips_first_sightings() -> None:
    tc = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 2**28, "store_threshold": 2},
    }
    e = engine("--profile", "tiny", "--kv-transfer-config", json.dumps(tc))
    run(e, doc_ids(1, 160))
    assert e.stats.get("vllm:kv_offload_stores_skipped") == 10 and e.cpu is not None and len(e.cpu) == 0
    e.reset_prefix_cache(reset_external=False)
    run(e, doc_ids(1, 160))
    assert len(e.cpu) == 10  # seen twice: stored


def test_offload_prompt_only_false_also_stores_generated_blocks() -> None:
    base = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 2**28},
    }
    e1 = engine("--profile", "tiny", "--kv-transfer-config", json.dumps(base))
    base["kv_connector_extra_config"]["offload_prompt_only"] = False  # type: ignore[index]
    e2 = engine("--profile", "tiny", "--kv-transfer-config", json.dumps(base))
    for e in (e1, e2):
        run(e, doc_ids(1, 160), max_tokens=40)
    assert e1.cpu is not None and e2.cpu is not None
    assert len(e1.cpu) == 10 and len(e2.cpu) == 12  # 200 tokens -> 12 full blocks


def _tiering(root: Path, cpu_bytes: int) -> str:
    return json.dumps(
        {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": cpu_bytes,
                "eviction_policy": "lru",
                "secondary_tiers": [{"type": "fs", "root_dir": str(root)}],
            },
        }
    )


def test_fs_tier_serves_after_cpu_eviction_and_across_restarts(tmp_path: Path) -> None:
    # 100 chunks of 16 tokens: each 60-chunk document fits (vLLM stores nothing of a request with
    # more new chunks than the tier can make room for), and doc 3 pushes doc 1 out
    tc = _tiering(tmp_path, 100 * 16 * 114_688)
    argv = (
        "--profile",
        "tiny",
        "--num-gpu-blocks-override",
        "80",
        "--max-model-len",
        "1024",
        "--kv-transfer-config",
        tc,
    )
    e = engine(*argv)
    run(e, doc_ids(1, 320))
    run(e, doc_ids(2, 960))  # with doc 3, evicts doc 1 from the GPU and from the 100-chunk CPU tier
    run(e, doc_ids(3, 960))
    r = run(e, doc_ids(1, 320))
    assert r.gpu_hit_tokens == 0
    assert r.ext_tokens == 304 and r.ext_disk_tokens == 304  # all from disk (promoted through CPU)
    assert len(list(tmp_path.rglob("*.kv"))) == 140
    assert e.stats.get("vllm:kv_offload_tiering_block_hits", tier="1:fs") == 19
    assert e.stats.get("vllm:prompt_tokens_cached_by_source", source="disk") == 304
    e2 = engine(*argv)  # a restart: GPU and CPU empty, the fs tier still holds the prompts
    r2 = run(e2, doc_ids(2, 960))
    assert r2.ext_disk_tokens == 944 and r2.gpu_hit_tokens == 0
    assert e2.reset_prefix_cache(reset_external=True)
    assert not list(tmp_path.rglob("*.kv"))


def test_lmcache_backend_reloads_but_has_no_offload_families() -> None:
    e = engine(
        "--profile",
        "tiny",
        "--num-gpu-blocks-override",
        "80",
        "--max-model-len",
        "1024",
        "--kv-offloading-size",
        "0.5",
        "--kv-offloading-backend",
        "lmcache",
    )
    run(e, doc_ids(1, 320))
    run(e, doc_ids(2, 960))
    run(e, doc_ids(3, 960))
    r = run(e, doc_ids(1, 320))
    assert r.ext_tokens == 304
    assert not any(n.startswith("vllm:kv_offload") for n in e.stats.counters)
    assert e.stats.get("vllm:prompt_tokens_cached_by_source", source="external_unspecified") == 304


HYBRID = (
    "--profile",
    "rtx4070-qwen3.5-4b",
    "--num-gpu-blocks-override",
    "4",
    "--max-model-len",
    "3000",
    "--kv-offloading-size",
    "1",
)


def _evict_and_reload(e: Engine) -> None:
    run(e, doc_ids(1, 1700), 4)
    run(e, doc_ids(2, 1700), 4)  # evicts doc 1 from the 4-block GPU pool; its blocks are in the CPU tier
    assert e.cpu is not None and len(e.cpu) == 4


def test_hybrid_reload_crashes_the_engine() -> None:
    e = engine(*HYBRID, "--hybrid-failure", "crash")
    _evict_and_reload(e)
    stored = e.stats.get("vllm:kv_offload_store_bytes")
    assert stored > 0  # offload stores work on the hybrid model
    r = run(e, doc_ids(1, 1700), 4)
    assert r.phase == "failed" and r.error and e.dead
    assert e.stats.get("vllm:kv_offload_load_bytes") == 0


def test_hybrid_reload_hangs_the_engine_and_lookups_grow() -> None:
    e = engine(*HYBRID, "--hybrid-failure", "hang")
    _evict_and_reload(e)
    t = e.t + 1
    r = e.submit("reload", doc_ids(1, 1700), 4, t)
    other = e.submit("other", doc_ids(3, 100), 4, t + 0.1)
    e.advance(t + 1)
    lookups = e.stats.histograms["vllm:kv_offload_lookup_sync_delay_seconds"][()].count
    e.advance(t + 3)
    assert e.stats.histograms["vllm:kv_offload_lookup_sync_delay_seconds"][()].count > lookups
    assert r.phase == "deferred" and r.first_token_at is None and other.first_token_at is None
    assert e.next_event_time() is None
    assert e.gauges()["waiting_deferred"] == 1
    assert e.stats.get("vllm:kv_offload_load_bytes") == 0  # 0 tokens transferred


def test_abort_frees_blocks_and_counts() -> None:
    e = engine("--profile", "tiny")
    r = e.submit("x", doc_ids(1, 500), 500, 1.0)
    e.advance(1.2)
    assert e.pool.num_used > 0
    e.abort("x", 1.3)
    assert e.pool.num_used == 0 and r.phase == "aborted"
    assert e.stats.get("vllm:request_success", finished_reason="abort") == 1
    assert e.next_event_time() is None


def test_events_produced_inside_submit_are_not_lost() -> None:
    e = engine("--profile", "tiny")
    seen: list[tuple[str, str]] = []
    e.submit("a", doc_ids(1, 200), 20, 1.0)
    seen += [(ev.request_id, ev.kind) for ev in e.advance(1.05)]
    e.submit("b", doc_ids(2, 200), 5, 1.2)  # a's tokens between 1.05 and 1.2 are produced in here
    e.submit("c", doc_ids(3, 200), 5, 1.25)
    while (t := e.next_event_time()) is not None:
        seen += [(ev.request_id, ev.kind) for ev in e.advance(t)]
    for rid, n in (("a", 20), ("b", 5), ("c", 5)):
        kinds = [k for r, k in seen if r == rid]
        assert kinds == ["first_token", *["token"] * (n - 1), "finished"], (rid, kinds)
