"""Probe sizing from the server's capacities (GPU pool, offload tiers) and foreign-traffic figures:
pure functions, checked on every captured /metrics exposition and on hand-made edge cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.workloads.probe import plan_probe
from agent.workloads.snapshot import foreign_traffic, parse_snapshot, tier_capacities
from agent.workloads.spec import WorkloadSpec
from tests.paths import FIXTURES

FIXTURES = FIXTURES / "vllm"
PROBE = WorkloadSpec(kind="probe", prefix_tokens=1500)


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.prom")), ids=lambda p: p.name)
def test_every_capture_gives_tiers_the_plan_can_be_sized_against(path: Path) -> None:
    snap = parse_snapshot(path.read_text())
    tiers = tier_capacities(snap.cache_config, snap.offload_config, snap.kv_connector)
    offload = snap.cache_config.get("kv_offloading_size") not in (None, "None")
    assert bool(tiers) == (offload or bool(snap.offload_config) or snap.kv_connector)
    assert snap.kv_connector == ("example-connector" in path.name)  # the real ExampleConnector capture
    if snap.kv_connector:
        assert tiers[0]["name"] == "external KV connector" and tiers[0]["tokens"] is None
    pool = int(float(snap.cache_config["kv_cache_size_tokens"]))
    plan = plan_probe(PROBE, pool, tiers, block_tokens=int(snap.cache_config["block_size"]))
    assert plan["evict_prefixes"] * plan["evict_tokens"] > pool  # the probed prefix leaves the GPU pool
    assert plan["evict_tokens"] <= PROBE.prefix_tokens
    assert f"GPU pool ({pool:,} tokens)" in plan["text"]


def test_a_tier_that_holds_the_prefix_and_the_evicting_volume_is_used_as_is() -> None:
    plan = plan_probe(PROBE, 2336, [{"name": "CPU", "tokens": 4681, "source": "x"}], block_tokens=16)
    assert (plan["evict_prefixes"], plan["evict_tokens"], plan["feasible"]) == (2, 1176, True)
    assert "the CPU tier keeps it (3,852 of 4,681 tokens used)" in plan["text"]


def test_a_tier_smaller_than_the_pool_is_said_to_be_impossible() -> None:
    plan = plan_probe(PROBE, 7280, [{"name": "CPU", "tokens": 3640, "source": "x"}])
    assert plan["feasible"] is False
    assert "NOT POSSIBLE for the CPU tier: it holds 3,640 tokens" in plan["text"]
    assert plan["evict_prefixes"] * plan["evict_tokens"] > 7280  # still evicts from the GPU: measures recompute


def test_max_model_len_caps_each_evicting_prefix_and_hand_set_counts_are_kept() -> None:
    capped = plan_probe(WorkloadSpec(kind="probe", prefix_tokens=1500), 7280, [], max_model_len=1024)
    assert capped["evict_tokens"] <= 1024 - 16 - 1 and capped["evict_prefixes"] * capped["evict_tokens"] > 7280
    by_hand = plan_probe(WorkloadSpec(kind="probe", evict_prefixes=3), 7280, [])
    assert (by_hand["evict_prefixes"], by_hand["evict_tokens"]) == (3, 1500) and "set by hand" in by_hand["text"]
    unknown = plan_probe(PROBE, None, [])
    assert unknown["evict_prefixes"] == 2 and "GPU pool size unknown" in unknown["text"]


def test_tiers_from_offload_config_size_fallback_and_secondary_tiers() -> None:
    off = {"cpu_num_chunks": "910", "offload_block_size": "16", "secondary_tiers": "fs:/mnt/kv"}
    tiers = tier_capacities({}, off)
    assert tiers[0] == {"name": "CPU", "tokens": 14560, "source": "kv_offload_config_info (cpu_num_chunks)"}
    assert tiers[1]["name"] == "fs" and tiers[1]["tokens"] is None and "/mnt/kv" in tiers[1]["source"]
    cc = {"kv_offloading_size": "2.0", "kv_cache_memory_bytes": "1073741824", "kv_cache_size_tokens": "7280"}
    assert tier_capacities(cc, {})[0]["tokens"] == 14560  # 2 GiB at the GPU pool's bytes per token
    unsized = tier_capacities({"kv_offloading_size": "2.0", "kv_cache_memory_bytes": "None"}, {})
    assert unsized[0]["tokens"] is None and "bytes per token unknown" in unsized[0]["source"]
    assert tier_capacities({"kv_offloading_size": "garbage"}, {"cpu_num_chunks": "x"}) == []
    # a plan against an unsized tier still sizes the GPU side and names the tier
    plan = plan_probe(PROBE, 7280, unsized)
    assert plan["feasible"] and "CPU tier" in plan["text"]


def test_foreign_traffic_counts_what_the_run_did_not_send() -> None:
    ours = [{"tag": "cold", "ok": True, "prompt_tokens": 1500}, {"tag": "hit", "ok": True, "prompt_tokens": 1500}]
    f = foreign_traffic({"requests_finished": 5.0, "prompt_tokens": 4000.0}, ours)
    assert (f["requests"], f["prompt_tokens"]) == (3, 1000)
    assert f["request_share"] == pytest.approx(0.6) and f["prompt_token_share"] == pytest.approx(0.25)
    clean = foreign_traffic({"requests_finished": 2.0, "prompt_tokens": 3000.0}, ours)
    assert (clean["requests"], clean["prompt_tokens"], clean["request_share"]) == (0, 0, 0.0)
    # missing counters or usage: unknown, never a guess
    unknown = foreign_traffic(None, ours)
    assert unknown["requests"] is None and unknown["prompt_tokens"] is None
    no_usage = foreign_traffic({"requests_finished": 2.0, "prompt_tokens": 9.0}, [{"tag": "x", "ok": True}])
    assert no_usage["requests"] == 1 and no_usage["prompt_tokens"] is None
