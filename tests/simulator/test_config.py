"""vLLM's flags, the effective config, pool sizes, and vLLM-like start-up errors."""

from __future__ import annotations

import json

import pytest

from kvscope.cli import main as kvscope_main
from simulator.config import StartupError, config_from_argv


def cfg(*argv: str):  # type: ignore[no-untyped-def]
    return config_from_argv(list(argv))


def test_defaults_follow_vllm() -> None:
    c = cfg("--profile", "rtx4070-qwen3-4b")
    assert c.block_size == 16 and c.cache_dtype == "auto" and c.enable_prefix_caching
    assert c.gpu_memory_utilization == 0.9 and c.offload is None
    labels = c.cache_config_labels()
    assert labels["kv_offloading_size"] == "None" and labels["kv_offloading_backend"] == "native"
    assert labels["num_cpu_blocks"] == "None" and labels["enable_prefix_caching"] == "True"
    assert int(labels["kv_cache_size_tokens"]) == c.num_gpu_blocks * 16
    assert c.served_model_name == "Qwen/Qwen3-4B-FP8"


def test_pool_bytes_per_token_from_shape_and_dtype() -> None:
    auto = cfg("--profile", "rtx4070-qwen3-4b")
    assert auto.kv_bytes_per_token == 36 * 8 * 128 * 2 * 2
    fp8 = cfg("--profile", "rtx4070-qwen3-4b", "--kv-cache-dtype", "fp8")
    assert fp8.kv_bytes_per_token == auto.kv_bytes_per_token // 2
    # field: FP8 KV ~1.8x the tokens of auto (70,284 -> 127,622); +-15%
    assert abs(fp8.kv_cache_size_tokens / auto.kv_cache_size_tokens / 1.82 - 1) <= 0.15
    for dt in ("fp8_e4m3", "fp8_e5m2"):
        assert (
            cfg("--profile", "rtx4070-qwen3-4b", "--kv-cache-dtype", dt).kv_cache_size_tokens
            == fp8.kv_cache_size_tokens
        )


def test_hybrid_holds_about_1_7x_the_dense_pool() -> None:
    dense = cfg("--profile", "rtx4070-qwen3-4b", "--kv-offloading-size", "8")
    hybrid = cfg("--profile", "rtx4070-qwen3.5-4b", "--kv-offloading-size", "8")
    assert abs(dense.kv_cache_size_tokens / 40_432 - 1) <= 0.15
    assert abs(hybrid.kv_cache_size_tokens / 67_435 - 1) <= 0.15
    assert abs(hybrid.kv_cache_size_tokens / dense.kv_cache_size_tokens / 1.7 - 1) <= 0.15
    assert hybrid.block_size == 832 and hybrid.mamba_cache_mode == "align"


def test_laptop_pool_and_cpu_tier_sizes() -> None:
    c = cfg(
        "--profile",
        "laptop8gb-qwen3-reranker-0.6b",
        "--kv-cache-memory-bytes",
        "268435456",
        "--max-model-len",
        "2048",
        "--kv-offloading-size",
        "0.5",
    )
    assert c.kv_cache_size_tokens == 2336  # the field's figure
    assert c.kv_bytes_per_token == 114_688  # ~115 KB per token
    assert abs(c.cpu_num_chunks * 16 / 4600 - 1) <= 0.15  # 0.5 GiB ~ 4,600 tokens
    assert c.cache_config_labels()["kv_offloading_size"] == "0.5"


def test_gpu_memory_utilization_and_kv_cache_memory_bytes_size_the_pool() -> None:
    low = cfg("--profile", "rtx4070-qwen3-4b", "--gpu-memory-utilization", "0.85")
    high = cfg("--profile", "rtx4070-qwen3-4b", "--gpu-memory-utilization", "0.95")
    assert low.num_gpu_blocks < high.num_gpu_blocks
    assert cfg("--profile", "tiny", "--kv-cache-memory-bytes", "1GiB").pool_bytes == 1024**3
    assert cfg("--profile", "tiny", "--num-gpu-blocks-override", "1000").num_gpu_blocks == 1000


def test_transfer_config_tiering_with_fs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tc = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 2**30,
            "block_size": 64,
            "eviction_policy": "arc",
            "store_threshold": 2,
            "offload_prompt_only": False,
            "secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path)}],
        },
    }
    c = cfg("--profile", "tiny", "--kv-transfer-config", json.dumps(tc))
    assert c.offload is not None
    o = c.offload
    assert (o.spec_name, o.chunk_tokens, o.eviction_policy, o.store_threshold) == (
        "TieringOffloadingSpec",
        64,
        "arc",
        2,
    )
    assert not o.offload_prompt_only and o.secondary_tiers[0].root_dir == str(tmp_path)
    assert c.cpu_num_chunks == 2**30 // (64 * c.kv_bytes_per_token)
    assert c.offload_config_labels() is not None


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (
            ["--profile", "rtx4070-qwen3.5-4b", "--kv-offloading-size", "4", "--kv-offloading-backend", "lmcache"],
            "failed to convert the KV cache specs to one unified type",
        ),
        (["--profile", "rtx4070-qwen3-4b", "--max-model-len", "100000"], "is greater than the derived max_model_len"),
        (
            ["--profile", "laptop8gb-qwen3-reranker-0.6b", "--kv-cache-memory-bytes", "268435456"],
            "estimated maximum model length is 2336",
        ),
        (["--profile", "tiny", "--gpu-memory-utilization", "1.5"], "GPU memory utilization must be within"),
        (["--profile", "tiny", "--gpu-memory-utilization", "0.1"], "No available memory for the cache blocks"),
        (["--profile", "tiny", "--kv-offloading-size", "1", "--kv-transfer-config", "{}"], "mutually exclusive"),
        (
            [
                "--profile",
                "tiny",
                "--kv-transfer-config",
                '{"kv_connector":"OffloadingConnector","kv_connector_extra_config":{"cpu_bytes_to_use":1e9,'
                '"eviction_policy":"fifo"}}',
            ],
            "Unknown eviction policy",
        ),
        (
            [
                "--profile",
                "tiny",
                "--kv-transfer-config",
                '{"kv_connector":"OffloadingConnector","kv_connector_extra_config":{"cpu_bytes_to_use":1e9,'
                '"block_size":24}}',
            ],
            "must be a multiple of the GPU block_size",
        ),
    ],
)
def test_invalid_combinations_fail_at_startup_like_vllm(argv: list[str], text: str) -> None:
    with pytest.raises(StartupError) as ei:
        cfg(*argv)
    assert text in ei.value.text
    assert "Engine core initialization failed" in ei.value.text or ei.value.exit_code == 2


def test_unknown_flag_rejected_like_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        kvscope_main(["sim", "--profile", "tiny", "--kv-offload-gib=4"])
    assert ei.value.code == 2
    assert "error: unrecognized arguments: --kv-offload-gib=4" in capsys.readouterr().err


def test_bad_choice_rejected_like_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        kvscope_main(["sim", "--kv-cache-dtype", "int4"])
    assert ei.value.code == 2
    assert "argument --kv-cache-dtype: invalid choice: 'int4'" in capsys.readouterr().err
