"""The normalised KV series every engine reader writes, and the builder they write them with.

Two kinds of output, both labelled ``kv_engine`` (which engine's families they came from):

1. The families the dashboard already reads (kvcore/kv_vocabulary.py: prompt tokens by source,
   prefix-cache hits/queries, offload load/store bytes and time). An engine reader writes them only
   where the engine does not export them itself: never for vLLM, whose own families are these
   (LMCache and vLLM's tiering add tier detail to a vLLM endpoint, they do not repeat its tokens).
   Source label values stay the dashboard's (local_cache_hit, external_kv_transfer,
   local_compute); ``tier`` says which tier supplied an external_kv_transfer.

2. Tier detail vLLM has no family for, under ``kvscope:kv_tier_*``, each labelled ``tier``
   (GPU, CPU, disk, object store, storage, remote, LMCache CPU ...):
   - ``kvscope:kv_tier_capacity_tokens`` / ``_used_tokens``, ``_capacity_bytes`` / ``_used_bytes``,
     ``_usage_ratio`` (0..1, where only a ratio is exported): gauges.
   - ``kvscope:kv_tier_transfer_bytes_total`` / ``_tokens_total`` / ``_blocks_total``
     ``{direction=load|store}``: counters. load = towards the GPU, store = away from it (for a tier
     behind another one, e.g. CPU -> disk, the ``path`` label says which hop).
   - ``kvscope:kv_tier_lookup_tokens_total`` / ``kvscope:kv_tier_hit_tokens_total``: counters whose
     increases give the tier's hit rate over any window (the engine's own definition, in
     ``definition``); ``_lookup_blocks_total`` / ``_hit_blocks_total`` where only blocks are known.
   - ``kvscope:kv_engine_hit_rate{tier, definition}``: a hit rate the engine computes itself
     (usually over its own recent window); shown as reported, never averaged.
   - ``kvscope:kv_engine_info{kv_engine, engine, components, block_size}`` = 1: what was detected.
   - ``kvscope:kv_engine_pinned_bytes``: pinned host memory as the engine reports it (TensorRT-LLM).

Block counts are converted to tokens with the engine's block size where it is known; such series
carry ``converted="blocks"`` and ``block_size="<n>"``. Where the block size is not known the
``_blocks_total`` family is written instead, unconverted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kvcore.exposition import RawSample

TIER_CAPACITY_TOKENS = "kvscope:kv_tier_capacity_tokens"
TIER_USED_TOKENS = "kvscope:kv_tier_used_tokens"
TIER_CAPACITY_BYTES = "kvscope:kv_tier_capacity_bytes"
TIER_USED_BYTES = "kvscope:kv_tier_used_bytes"
TIER_USAGE_RATIO = "kvscope:kv_tier_usage_ratio"
TIER_TRANSFER_BYTES = "kvscope:kv_tier_transfer_bytes_total"
TIER_TRANSFER_TOKENS = "kvscope:kv_tier_transfer_tokens_total"
TIER_TRANSFER_BLOCKS = "kvscope:kv_tier_transfer_blocks_total"
TIER_LOOKUP_TOKENS = "kvscope:kv_tier_lookup_tokens_total"
TIER_HIT_TOKENS = "kvscope:kv_tier_hit_tokens_total"
TIER_LOOKUP_BLOCKS = "kvscope:kv_tier_lookup_blocks_total"
TIER_HIT_BLOCKS = "kvscope:kv_tier_hit_blocks_total"
ENGINE_HIT_RATE = "kvscope:kv_engine_hit_rate"
ENGINE_INFO = "kvscope:kv_engine_info"
ENGINE_PINNED_BYTES = "kvscope:kv_engine_pinned_bytes"

FAMILY_TYPES: dict[str, str] = {
    TIER_CAPACITY_TOKENS: "gauge",
    TIER_USED_TOKENS: "gauge",
    TIER_CAPACITY_BYTES: "gauge",
    TIER_USED_BYTES: "gauge",
    TIER_USAGE_RATIO: "gauge",
    TIER_TRANSFER_BYTES: "counter",
    TIER_TRANSFER_TOKENS: "counter",
    TIER_TRANSFER_BLOCKS: "counter",
    TIER_LOOKUP_TOKENS: "counter",
    TIER_HIT_TOKENS: "counter",
    TIER_LOOKUP_BLOCKS: "counter",
    TIER_HIT_BLOCKS: "counter",
    ENGINE_HIT_RATE: "gauge",
    ENGINE_INFO: "gauge",
    ENGINE_PINNED_BYTES: "gauge",
}

# Tier names, as a person reads them (kvcore/kv_vocabulary.py names vLLM's tiers the same way)
GPU, CPU, DISK, OBJECT, STORAGE, REMOTE = "GPU", "CPU", "disk", "object store", "storage", "remote"

MAX_LABEL_VALUE = 200  # engine label values copied onto normalised series are cut to this


def family_type(name: str) -> str:
    """The family a sample name belongs to, as exposition.types keys it (counters lose _total)."""
    return name[:-6] if name.endswith("_total") else name


@dataclass
class Derived:
    """Normalised samples one engine reader wrote for one scrape, with their family types."""

    engine: str
    samples: list[RawSample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, labels: Mapping[str, str], value: float | None, mtype: str | None = None) -> None:
        """One sample; None and non-finite values are skipped (a missing operand is no zero)."""
        if value is None or not math.isfinite(value):
            return
        out = {k: str(v)[:MAX_LABEL_VALUE] for k, v in labels.items()}
        out["kv_engine"] = self.engine
        self.samples.append((name, out, float(value)))
        kind = mtype or FAMILY_TYPES.get(name) or ("counter" if name.endswith("_total") else "gauge")
        self.types.setdefault(family_type(name) if kind == "counter" else name, kind)


# ----------------------------------------------------------------------------- reading input
Samples = list[RawSample]


def of(samples: Iterable[RawSample], name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample named ``name``."""
    return [(labels, value) for n, labels, value in samples if n == name]


def by_name(samples: Iterable[RawSample], prefix: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples whose name starts with ``prefix``, grouped by name (finite values only)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for n, labels, value in samples:
        if n.startswith(prefix) and math.isfinite(value):
            out.setdefault(n, []).append((labels, value))
    return out


def without(labels: Mapping[str, str], *drop: str) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k not in drop}


def sum_by(
    rows: Iterable[tuple[dict[str, str], float]], keep: tuple[str, ...] = ()
) -> dict[tuple[tuple[str, str], ...], float]:
    """Sum values over every label except ``keep``; keys are the kept (label, value) pairs."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in rows:
        key = tuple((k, labels.get(k, "")) for k in keep)
        out[key] = out.get(key, 0.0) + value
    return out


def total(rows: Iterable[tuple[dict[str, str], float]]) -> float | None:
    vals = [v for _l, v in rows]
    return sum(vals) if vals else None


def first(rows: Iterable[tuple[dict[str, str], float]]) -> float | None:
    for _l, v in rows:
        return v
    return None


def block_size_of(value: float | None) -> int | None:
    """A block size read from an exposition or an override: a positive whole number or None."""
    if value is None or not math.isfinite(value) or value <= 0 or value != int(value) or value > 1 << 20:
        return None
    return int(value)


def converted(block_size: int) -> dict[str, str]:
    return {"converted": "blocks", "block_size": str(block_size)}


HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def copy_family(d: Derived, samples: Samples, src: str, dst: str, mtype: str, drop: tuple[str, ...] = ()) -> None:
    """An engine's family under the dashboard's name (its samples' labels kept, minus ``drop``):
    for families whose meaning is the same (TTFT histograms, running / waiting requests)."""
    suffixes = HISTOGRAM_SUFFIXES if mtype == "histogram" else ("",)
    for name, labels, value in samples:
        for suf in suffixes:
            if name == src + suf:
                d.add(dst + suf, {k: v for k, v in labels.items() if k not in drop}, value, mtype)
                break
    if mtype == "histogram" and any(n == dst + "_count" for n, _l, _v in d.samples):
        d.types[dst] = "histogram"
