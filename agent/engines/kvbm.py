"""NVIDIA Dynamo's KV block manager (``kvbm_``, its own endpoint) into the KV vocabulary.

KVBM serves its families on a port of its own (DYN_KVBM_METRICS_PORT, default 6880, with
DYN_KVBM_METRICS=true), from a Rust registry with the fixed prefix ``kvbm_``: counters without a
``_total`` suffix and without labels (lib/llm/src/block_manager/metrics_kvbm.rs; names in
dynamo's prometheus_names.py, checked against the kvbm 1.6.1 binary).
- ``kvbm_offload_blocks_{d2h,h2d,d2d,d2o}``: blocks moved away from the GPU. Mind the letters:
  in ``offload_*`` h2d is host -> DISK; in ``onboard_*`` h2d is host -> DEVICE.
- ``kvbm_onboard_blocks_{h2d,d2d,o2d}``: blocks brought back to the GPU from host, disk, object.
- Older builds name the object tier "remote": ``offload_blocks_d2r``, ``onboard_blocks_r2d``,
  ``remote_cache_hit_rate`` (read the same, tier "remote").
- ``kvbm_{offload,onboard}_bytes_object`` (``_remote``): bytes to / from object storage.
- ``kvbm_{host,disk,object}_cache_hit_rate``: KVBM's own rates over its sliding window (gauges).
- ``kvbm_matched_tokens``: tokens KVBM matched in its tiers (no denominator is exported, so no
  hit rate of ours; the vLLM endpoint's external prefix-cache counters carry that).
Blocks are converted to tokens only with a block size given by the operator (KVBM exports none);
otherwise they are written as blocks.
"""

from __future__ import annotations

from agent.engines.kv_series import (
    CPU,
    DISK,
    ENGINE_HIT_RATE,
    OBJECT,
    REMOTE,
    TIER_TRANSFER_BLOCKS,
    TIER_TRANSFER_BYTES,
    TIER_TRANSFER_TOKENS,
    Derived,
    Samples,
    by_name,
    converted,
    total,
)

NAME = "dynamo-kvbm"
TITLE = "Dynamo KVBM"
PREFIXES: tuple[str, ...] = ("kvbm_",)
KEEP: tuple[str, ...] = ("kvbm_",)
HIT_RATE_DEFINITION = "KVBM sliding-window hit rate of the tier"
# family suffix -> (tier, direction, path)
BLOCK_FAMILIES: dict[str, tuple[str, str, str]] = {
    "offload_blocks_d2h": (CPU, "store", "GPU->CPU"),
    "offload_blocks_h2d": (DISK, "store", "CPU->disk"),
    "offload_blocks_d2d": (DISK, "store", "GPU->disk"),
    "offload_blocks_d2o": (OBJECT, "store", "GPU->object store"),
    "offload_blocks_d2r": (REMOTE, "store", "GPU->remote"),
    "onboard_blocks_h2d": (CPU, "load", "CPU->GPU"),
    "onboard_blocks_d2d": (DISK, "load", "disk->GPU"),
    "onboard_blocks_o2d": (OBJECT, "load", "object store->GPU"),
    "onboard_blocks_r2d": (REMOTE, "load", "remote->GPU"),
}
BYTE_FAMILIES: dict[str, tuple[str, str, str]] = {
    "offload_bytes_object": (OBJECT, "store", "GPU->object store"),
    "onboard_bytes_object": (OBJECT, "load", "object store->GPU"),
    "offload_bytes_remote": (REMOTE, "store", "GPU->remote"),
    "onboard_bytes_remote": (REMOTE, "load", "remote->GPU"),
}
HIT_RATES = {"host": CPU, "disk": DISK, "object": OBJECT, "remote": REMOTE}


def block_size(samples: Samples) -> float | None:
    return None  # not exported: give it as an override to convert blocks to tokens


def read(samples: Samples, block_size: int | None = None) -> Derived:
    d = Derived(NAME)
    fam = by_name(samples, "kvbm_")

    def t(suffix: str) -> float | None:
        # the Rust crate writes no _total; a Prometheus-side rename may add it
        return total(fam.get("kvbm_" + suffix) or fam.get("kvbm_" + suffix + "_total") or [])

    for suffix, (tier, direction, path) in BLOCK_FAMILIES.items():
        value = t(suffix)
        labels = {"tier": tier, "direction": direction, "path": path}
        if block_size and value is not None:
            d.add(TIER_TRANSFER_TOKENS, {**labels, **converted(block_size)}, value * block_size)
        else:
            d.add(TIER_TRANSFER_BLOCKS, labels, value)
    for suffix, (tier, direction, path) in BYTE_FAMILIES.items():
        d.add(TIER_TRANSFER_BYTES, {"tier": tier, "direction": direction, "path": path}, t(suffix))
    for kind, tier in HIT_RATES.items():
        d.add(ENGINE_HIT_RATE, {"tier": tier, "definition": HIT_RATE_DEFINITION}, t(f"{kind}_cache_hit_rate"))
    return d
