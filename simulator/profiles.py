"""Profiles: a model shape plus a device. Bytes per token derive from the shape and the KV dtype.

The timing parameters are fitted to the field figures in DOMAIN.md (see docs/simulator.md for the
arithmetic); the shapes are the models' published shapes where known, and marked as fitted where not.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
MIB = 1024**2

# KV dtype -> bytes per element. "auto" follows the model's activation dtype (bf16 for these models).
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class ModelShape:
    name: str  # the HF-style model id served by default
    layers: int  # full-attention layers (the ones with a per-token KV cache)
    kv_heads: int
    head_dim: int
    max_position_embeddings: int
    weights_bytes: int
    linear_layers: int = 0  # linear-attention / recurrent layers (hybrid models)
    linear_state_bytes: int = 0  # recurrent state of one linear layer for one cached block (align mode)
    attention_block_size: int | None = None  # hybrid: the block size vLLM forces (large)

    @property
    def is_hybrid(self) -> bool:
        return self.linear_layers > 0

    def kv_bytes_per_token(self, cache_dtype: str) -> int:
        """Full-attention K and V bytes of one token: layers x kv_heads x head_dim x 2 x dtype bytes."""
        return self.layers * self.kv_heads * self.head_dim * 2 * DTYPE_BYTES[cache_dtype]

    def pool_bytes_per_token(self, cache_dtype: str, block_size: int) -> float:
        """GPU pool bytes one cached token costs, counting a hybrid's per-block recurrent-state checkpoint."""
        per_token = float(self.kv_bytes_per_token(cache_dtype))
        if self.is_hybrid:
            per_token += self.linear_layers * self.linear_state_bytes / block_size
        return per_token


@dataclass(frozen=True)
class Device:
    name: str
    memory_total_bytes: int
    non_kv_bytes: int  # activations, CUDA graphs, allocator slack: what the profiler reserves besides weights
    pcie_bytes_per_s: float  # effective pinned host<->GPU copy rate for KV blocks (one direction)
    load_step_s: float  # extra engine step a request waits when its KV is loaded by the connector
    pcie_gen_max: int = 4
    pcie_width_max: int = 16
    power_limit_w: float = 200.0
    idle_power_w: float = 14.0
    disk_bytes_per_s: float = 2.5e9  # fs secondary tier read/write rate
    uuid: str = "GPU-5c8b1e3a-7d42-9f10-c2e6-84a0b3d9f217"


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model: ModelShape
    device: Device
    default_max_model_len: int
    prefill_tokens_per_s: float  # whole-device prefill throughput (shared by concurrent prefills)
    itl_s: float  # inter-token latency of one decoding request
    base_overhead_s: float  # per-request front-end + scheduling overhead before prefill
    warmup_s: float  # extra latency of the first request after start-up
    itl_batch_slowdown: float = 0.03  # relative ITL growth per additional decoding request
    default_block_size: int = 16


RTX4070 = Device(
    name="NVIDIA GeForce RTX 4070",
    memory_total_bytes=12282 * MIB,
    non_kv_bytes=904_000_000,
    pcie_bytes_per_s=25.0e9,
    load_step_s=0.0070,
)

LAPTOP8GB = Device(
    name="NVIDIA GeForce RTX 4060 Laptop GPU",
    memory_total_bytes=8188 * MIB,
    non_kv_bytes=int(0.9 * GIB),
    pcie_bytes_per_s=12.6e9,
    load_step_s=0.0066,
    power_limit_w=115.0,
    idle_power_w=8.0,
    uuid="GPU-7a1d5e20-c3b4-4f8a-9e61-2d0b7c5f8a13",
)

QWEN3_4B = ModelShape(
    name="Qwen/Qwen3-4B-FP8",
    layers=36,
    kv_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    weights_bytes=int(4.4 * GIB),
)

# Qwen3.5-4B: 8 full-attention + 24 linear-attention layers. The recurrent-state size and the forced
# attention block size are fitted (pool ratio 1.7x, a ~2,500-token prefix hitting on 3 blocks).
QWEN35_4B = ModelShape(
    name="Qwen/Qwen3.5-4B-FP8",
    layers=8,
    kv_heads=4,
    head_dim=256,
    max_position_embeddings=262144,
    weights_bytes=int(4.4 * GIB),
    linear_layers=24,
    linear_state_bytes=1_929_216,
    attention_block_size=832,
)

QWEN3_RERANKER_06B = ModelShape(
    name="Qwen/Qwen3-Reranker-0.6B",
    layers=28,
    kv_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    weights_bytes=int(1.2 * GIB),
)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="rtx4070-qwen3-4b",
            description="dense Qwen3-4B-FP8 on an RTX 4070 12GB",
            model=QWEN3_4B,
            device=RTX4070,
            default_max_model_len=32768,
            prefill_tokens_per_s=7742.0,
            itl_s=0.01351,
            base_overhead_s=0.0260,
            warmup_s=0.030,
        ),
        Profile(
            name="rtx4070-qwen3.5-4b",
            description="hybrid Qwen3.5-4B-FP8 (24 linear + 8 full attention) on an RTX 4070 12GB",
            model=QWEN35_4B,
            device=RTX4070,
            default_max_model_len=32768,
            prefill_tokens_per_s=973.8,
            itl_s=0.00353,
            base_overhead_s=0.0260,
            warmup_s=0.030,
        ),
        Profile(
            name="laptop8gb-qwen3-reranker-0.6b",
            description="Qwen3-Reranker-0.6B on an 8GB laptop GPU",
            model=QWEN3_RERANKER_06B,
            device=LAPTOP8GB,
            default_max_model_len=40960,
            prefill_tokens_per_s=25143.0,
            itl_s=0.0062,
            base_overhead_s=0.01336,
            warmup_s=0.027,
        ),
        Profile(
            name="tiny",
            description="a small fast dense model for quick tests and demos (Qwen3-0.6B-like on the 4070)",
            model=ModelShape(
                name="Qwen/Qwen3-0.6B",
                layers=28,
                kv_heads=8,
                head_dim=128,
                max_position_embeddings=40960,
                weights_bytes=int(1.2 * GIB),
            ),
            device=RTX4070,
            default_max_model_len=8192,
            prefill_tokens_per_s=30000.0,
            itl_s=0.006,
            base_overhead_s=0.010,
            warmup_s=0.020,
        ),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; choose one of: {', '.join(sorted(PROFILES))}") from None
