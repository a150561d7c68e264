"""Profiles: validation and rendering to vLLM's own argv."""

from __future__ import annotations

import json

import pytest

from app.controller.profiles import GIB, ProfileError, argv_diff, flag_map, parse_profile


def test_empty_profile_renders_nothing() -> None:
    assert parse_profile("dense", {}).to_argv() == []


def test_native_offload_renders_simple_flags() -> None:
    p = parse_profile("off8", {"offload_size_gib": 8})
    assert p.to_argv() == ["--kv-offloading-size", "8", "--kv-offloading-backend", "native"]
    assert p.pinned_bytes == 8 * GIB
    assert parse_profile("half", {"offload_size_gib": 0.5}).to_argv()[1] == "0.5"


def test_knobs_render_a_transfer_config_json() -> None:
    p = parse_profile(
        "tiered",
        {
            "offload_size_gib": 4,
            "offload_spec": "tiering",
            "eviction_policy": "arc",
            "store_threshold": 2,
            "fs_tier": {"root_dir": "/mnt/kv", "n_read_threads": 8},
        },
    )
    argv = p.to_argv()
    assert argv[0] == "--kv-transfer-config" and len(argv) == 2
    cfg = json.loads(argv[1])
    assert cfg["kv_connector"] == "OffloadingConnector"
    extra = cfg["kv_connector_extra_config"]
    assert extra["spec_name"] == "TieringOffloadingSpec"
    assert extra["cpu_bytes_to_use"] == 4 * GIB
    assert extra["eviction_policy"] == "arc" and extra["store_threshold"] == 2
    assert extra["secondary_tiers"] == [
        {"type": "fs", "root_dir": "/mnt/kv", "n_read_threads": 8, "n_write_threads": 4}
    ]
    cpu = json.loads(parse_profile("lru", {"offload_size_gib": 1, "eviction_policy": "lru"}).to_argv()[1])
    assert cpu["kv_connector_extra_config"]["spec_name"] == "CPUOffloadingSpec"


def test_pool_and_cache_flags() -> None:
    p = parse_profile(
        "fp8",
        {
            "kv_cache_dtype": "fp8",
            "gpu_memory_utilization": 0.9,
            "max_model_len": 8192,
            "enable_prefix_caching": False,
            "extra_args": ["--enforce-eager"],
        },
    )
    assert p.to_argv() == [
        "--kv-cache-dtype",
        "fp8",
        "--gpu-memory-utilization",
        "0.9",
        "--max-model-len",
        "8192",
        "--no-enable-prefix-caching",
        "--enforce-eager",
    ]
    assert parse_profile("b", {"kv_cache_memory_bytes": 1 << 30}).to_argv() == ["--kv-cache-memory-bytes", "1073741824"]
    assert "--enable-prefix-caching" in parse_profile("c", {"enable_prefix_caching": True}).to_argv()


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"gpu_memory_utilization": 0.9, "kv_cache_memory_bytes": 10}, "not both"),
        ({"eviction_policy": "lru"}, "need offload_size_gib"),
        ({"offload_size_gib": 2, "offload_backend": "lmcache", "store_threshold": 2}, "native-only"),
        ({"offload_size_gib": 2, "offload_spec": "tiering"}, "needs an fs_tier"),
        ({"offload_size_gib": 2, "fs_tier": {"root_dir": "/mnt/x"}}, "needs offload_spec"),
        ({"offload_size_gib": 2, "offload_spec": "tiering", "fs_tier": {"root_dir": "rel"}}, "absolute"),
        ({"offload_size_gib": -1}, "offload_size_gib"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype"),
        ({"extra_args": ["--kv-cache-dtype", "fp8"]}, "is a profile field"),
        ({"extra_args": ["rm -rf /"]}, "is not a --flag"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_invalid_profiles_say_why(spec: dict[str, object], fragment: str) -> None:
    with pytest.raises(ProfileError, match=fragment):
        parse_profile("p", spec)


def test_bad_name() -> None:
    with pytest.raises(ProfileError, match="name"):
        parse_profile("has space", {})


def test_spec_round_trip() -> None:
    p = parse_profile("x", {"offload_size_gib": 8, "kv_cache_dtype": "fp8"})
    assert parse_profile("x", p.spec()) == p


def test_argv_diff() -> None:
    before = parse_profile("a", {"kv_cache_dtype": "fp8", "max_model_len": 4096}).to_argv()
    after = parse_profile("b", {"offload_size_gib": 8, "max_model_len": 4096}).to_argv()
    assert argv_diff(before, after) == [
        ("--kv-cache-dtype", "fp8", None),
        ("--kv-offloading-backend", None, "native"),
        ("--kv-offloading-size", None, "8"),
    ]
    assert flag_map(["--a=1", "--b", "--c", "2"]) == {"--a": "1", "--b": "", "--c": "2"}
