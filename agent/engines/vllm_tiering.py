"""vLLM's own offload tiers (OffloadingConnector; TieringOffloadingSpec) as per-tier KV series.

vLLM's offload families are already in the dashboard's vocabulary (kvcore/normalise.py keeps them
under their own names). This reader adds what they say per tier, so every tier is named:
- ``vllm:kv_offload_tiering_chunk_{queries,hits}_total{tier}`` (vllm 0.32.0; named ``block_*`` in
  newer builds and in kvscope's metric catalog: both are read, never both counted) -> per-tier
  lookups and hits. Units are offload chunks, not tokens: converted with the offload block size
  when one is given (``block_size`` override), otherwise written as blocks.
- ``vllm:kv_offload_tiering_{read,write}_bytes_total{tier}`` -> per-tier transfer bytes between the
  CPU primary tier and a secondary tier (read = promotion into CPU, direction load; write =
  cascade out of CPU, direction store).
- ``vllm:kv_offload_{load,store}_bytes_total`` -> the CPU tier's GPU <-> CPU bytes, per tier too.
Tier labels: ``0:primary`` = CPU, ``<i>:fs`` = disk, ``<i>:obj`` = object store, ``<i>:p2p`` = peer.
"""

from __future__ import annotations

from agent.engines.kv_series import (
    CPU,
    TIER_HIT_BLOCKS,
    TIER_HIT_TOKENS,
    TIER_LOOKUP_BLOCKS,
    TIER_LOOKUP_TOKENS,
    TIER_TRANSFER_BYTES,
    Derived,
    Samples,
    by_name,
    converted,
    sum_by,
    total,
)
from kvcore.kv_vocabulary import LOAD_BYTES, STORE_BYTES, TIERING_KINDS

NAME = "vllm"
TITLE = "vLLM"
PREFIXES: tuple[str, ...] = ("vllm:",)
KEEP: tuple[str, ...] = ()  # kvcore/normalise.py keeps vLLM's families
P = "vllm:kv_offload_tiering_"
DEFINITION = "offload chunks found / chunks looked up, per tier (TieringOffloadingSpec)"


def tier_name(label: str) -> str:
    """``0:primary`` -> CPU, ``1:fs`` -> disk, ``2:obj`` -> object store; unknown kinds as written."""
    kind = label.split(":", 1)[-1].strip().lower()
    return TIERING_KINDS.get(kind, kind or label or "(no tier)")


def block_size(samples: Samples) -> float | None:
    return None  # the offload chunk size is not exported (kv_offload_config_info is not in 0.32.0)


def read(samples: Samples, block_size: int | None = None) -> Derived:
    d = Derived(NAME)
    own = by_name(samples, "vllm:kv_offload_")
    fam = {n: rows for n, rows in own.items() if n.startswith(P)}
    for what in ("queries", "hits"):
        rows = fam.get(f"{P}chunk_{what}_total") or fam.get(f"{P}block_{what}_total") or []
        for key, value in sum_by(rows, ("tier",)).items():
            raw = dict(key)["tier"]
            labels = {"tier": tier_name(raw), "tier_label": raw, "definition": DEFINITION}
            if block_size:
                name = TIER_LOOKUP_TOKENS if what == "queries" else TIER_HIT_TOKENS
                d.add(name, {**labels, **converted(block_size)}, value * block_size)
            else:
                d.add(TIER_LOOKUP_BLOCKS if what == "queries" else TIER_HIT_BLOCKS, labels, value)
    for what, direction in (("read", "load"), ("write", "store")):
        for key, value in sum_by(fam.get(f"{P}{what}_bytes_total", []), ("tier",)).items():
            raw = dict(key)["tier"]
            name = tier_name(raw)
            path = f"{name}->CPU" if what == "read" else f"CPU->{name}"
            d.add(TIER_TRANSFER_BYTES, {"tier": name, "tier_label": raw, "direction": direction, "path": path}, value)
    d.add(TIER_TRANSFER_BYTES, {"tier": CPU, "direction": "load", "path": "CPU->GPU"}, total(own.get(LOAD_BYTES, [])))
    d.add(TIER_TRANSFER_BYTES, {"tier": CPU, "direction": "store", "path": "GPU->CPU"}, total(own.get(STORE_BYTES, [])))
    return d
