"""Preflight on recorded host trees and model configs: pass / warn / refuse with the numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import preflight as pf
from agent.preflight import GIB, OffloadPlan

FIX = Path(__file__).parent / "fixtures"
BOX = FIX / "hosts" / "box32g-cgv2"
LAPTOP = FIX / "hosts" / "laptop16g-cgv1"


def _mem(tree: Path, shm_free: int | None = 16 * GIB) -> pf.HostMemory:
    return pf.read_host_memory(
        tree / "proc", tree / "sys" / "fs" / "cgroup", Path("/nonexistent"), shm_free=lambda _p: shm_free
    )


def test_readers_on_recorded_trees() -> None:
    box = _mem(BOX)
    assert box.mem_total == 32768000 * 1024 and box.mem_available == 20 * GIB
    assert box.cgroup_limit == 16 * GIB and box.cgroup_current == 4 * GIB
    laptop = _mem(LAPTOP)
    assert laptop.mem_available == 6 * GIB
    assert laptop.cgroup_limit is None  # v1 "unlimited"
    assert laptop.cgroup_current == 3 * GIB
    # Missing tree: nothing known, nothing raised.
    empty = pf.read_host_memory(
        Path("/nonexistent/proc"), Path("/nonexistent/cg"), Path("/nonexistent"), shm_free=lambda _p: None
    )
    assert empty == pf.HostMemory()


def _by_name(checks: list[pf.Check]) -> dict[str, pf.Check]:
    return {c.name: c for c in checks}


def test_8gib_offload_fits_the_box() -> None:
    checks = _by_name(pf.check_memory(OffloadPlan(True, "native", "cpu", 8 * GIB), _mem(BOX)))
    assert checks["pinned_vs_memavailable"].status == "pass"
    assert checks["pinned_vs_memavailable"].numbers["room_bytes"] == 18 * GIB  # 20 - 2 headroom
    assert checks["pinned_vs_cgroup"].status == "pass"
    assert checks["pinned_vs_dev_shm"].status == "pass"
    assert checks["power_of_two_overallocation"].status == "pass"  # 8 GiB is a power of two


def test_oversize_offload_is_refused_with_numbers() -> None:
    checks = _by_name(pf.check_memory(OffloadPlan(True, "native", "cpu", 24 * GIB), _mem(BOX, shm_free=10 * GIB)))
    mem = checks["pinned_vs_memavailable"]
    assert mem.status == "refuse"
    assert "24.00 GiB" in mem.message and "20.00 GiB" in mem.message and "18.00 GiB" in mem.message
    assert checks["pinned_vs_cgroup"].status == "refuse"  # 16 - 4 - 2 = 10 GiB of room
    assert checks["pinned_vs_cgroup"].numbers["room_bytes"] == 10 * GIB
    assert checks["pinned_vs_dev_shm"].status == "refuse"
    assert pf.summarize(list(checks.values())) == "refuse"


def test_cgroup_limit_refuses_what_ram_allows() -> None:
    checks = _by_name(pf.check_memory(OffloadPlan(True, "native", "cpu", 12 * GIB), _mem(BOX)))
    assert checks["pinned_vs_memavailable"].status == "pass"
    assert checks["pinned_vs_cgroup"].status == "refuse"


def test_restart_frees_the_running_buffer() -> None:
    plan = OffloadPlan(True, "native", "cpu", 6 * GIB)
    assert _by_name(pf.check_memory(plan, _mem(LAPTOP)))["pinned_vs_memavailable"].status == "refuse"
    again = _by_name(pf.check_memory(plan, _mem(LAPTOP), reclaim_bytes=4 * GIB))
    assert again["pinned_vs_memavailable"].status == "pass"
    assert again["pinned_vs_memavailable"].numbers["room_bytes"] == 8 * GIB


def test_power_of_two_warning() -> None:
    c = pf.check_power_of_two(int(4.5 * GIB), _mem(LAPTOP))
    assert c.status == "warn" and c.numbers["worst_case_bytes"] == 8 * GIB
    assert "1.78x" in c.message and "would not fit" in c.message
    assert pf.next_power_of_two(3) == 4 and pf.next_power_of_two(8) == 8


def test_register_limit_and_no_offload() -> None:
    huge = _by_name(pf.check_memory(OffloadPlan(True, "native", "cpu", 600 * GIB), _mem(BOX)))
    assert huge["pinned_register_limit"].status == "refuse"
    assert [c.status for c in pf.check_memory(OffloadPlan(), _mem(BOX))] == ["pass"]


def test_unknown_memory_warns() -> None:
    checks = _by_name(pf.check_memory(OffloadPlan(True, "native", "cpu", GIB), pf.HostMemory()))
    assert checks["pinned_vs_memavailable"].status == "warn"
    assert checks["pinned_vs_dev_shm"].status == "warn"


def test_hybrid_detection_from_config_json() -> None:
    hybrid = pf.find_model_config("/srv/models/Qwen3.5-4B-FP8", [FIX / "models"])
    dense = pf.find_model_config("Qwen3-4B-FP8", [FIX / "models"])
    assert hybrid is not None and dense is not None
    offload = OffloadPlan(True, "native", "cpu", 8 * GIB)
    c = pf.check_hybrid(offload, hybrid, {}, override=False)
    assert c.status == "refuse" and "24 of 32 layers linear_attention" in c.message
    assert pf.check_hybrid(offload, hybrid, {}, override=True).status == "warn"
    lm = pf.check_hybrid(OffloadPlan(True, "lmcache", "cpu", GIB), hybrid, {}, override=False)
    assert lm.status == "refuse" and "LMCache" in lm.message
    assert pf.check_hybrid(offload, dense, {}, override=False).status == "pass"
    assert pf.check_hybrid(OffloadPlan(), hybrid, {}, override=False).status == "pass"  # no offload asked
    assert pf.check_hybrid(offload, None, {}, override=False).status == "warn"  # unknown model


def test_hybrid_detection_from_cache_config_labels() -> None:
    offload = OffloadPlan(True, "native", "cpu", GIB)
    real = Path("tests/fixtures/vllm/real__vllm-0.32.0-cpu__tiny-llama__prefix-cache.prom").read_text()
    line = next(x for x in real.splitlines() if x.startswith("vllm:cache_config_info{"))
    from agent.controller import _labels_of

    dense_labels = _labels_of(line)
    assert dense_labels["mamba_cache_mode"] == "none"
    assert pf.check_hybrid(offload, None, dense_labels, override=False).status == "pass"
    hybrid_labels = {**dense_labels, "mamba_cache_mode": "align", "mamba_block_size": "2096"}
    assert pf.check_hybrid(offload, None, hybrid_labels, override=False).status == "refuse"


@pytest.mark.parametrize(
    ("cfg", "hybrid"),
    [
        ({"model_type": "nemotron_h", "hybrid_override_pattern": "M-M-M*"}, True),
        ({"model_type": "jamba"}, True),
        ({"layer_types": ["full_attention", "sliding_attention"]}, False),
        ({"layer_types": ["mamba", "attention"]}, True),
        ({}, False),
    ],
)
def test_hybrid_from_config_shapes(cfg: dict[str, object], hybrid: bool) -> None:
    assert pf.hybrid_from_config(cfg)[0] is hybrid


def test_flags_from_help() -> None:
    help_text = """usage: vllm serve [model_tag] [options]
  --kv-cache-dtype {auto,fp8}   Data type for kv cache storage.
  --enable-prefix-caching, --no-enable-prefix-caching
  --kv-offloading-size KV_OFFLOADING_SIZE
"""
    accepted = pf.flags_from_help(help_text)
    assert {"--kv-cache-dtype", "--no-enable-prefix-caching", "--kv-offloading-size"} <= accepted
    ok = pf.check_flags(["--kv-cache-dtype", "fp8", "--no-enable-prefix-caching"], accepted)
    assert ok.status == "pass"
    bad = pf.check_flags(["--kv-offloading-backend", "native", "--kv-offloading-size", "8"], accepted)
    assert bad.status == "refuse" and bad.numbers["unknown"] == ["--kv-offloading-backend"]
    assert pf.check_flags(["--x"], None).status == "warn"
    assert pf.default_help_command(["/venv/bin/vllm", "serve", "m"])[-1] == "--help=all"
    assert pf.default_help_command(["kvscope", "sim"])[-1] == "--help"


def test_pinned_bytes_from_argv() -> None:
    from app.controller.profiles import parse_profile

    for spec in ({"offload_size_gib": 8}, {"offload_size_gib": 0.5, "eviction_policy": "lru"}, {}):
        p = parse_profile("x", spec)
        assert pf.pinned_bytes_from_argv(p.to_argv()) == p.pinned_bytes
    assert pf.pinned_bytes_from_argv(["--kv-transfer-config", "{not json"]) == 0


def test_offload_plan_from_garbage() -> None:
    assert OffloadPlan.from_payload(None) == OffloadPlan()
    assert OffloadPlan.from_payload({"enabled": True, "pinned_bytes": "x"}).pinned_bytes == 0
