"""From a parsed vLLM exposition to the samples kvscope sends: kept families, current names.

- Families kept: what the dashboard, alerts and controller read (see KEEP_PREFIXES); everything
  else in vLLM's /metrics (python_*, http_*, most per-request histograms) stays on the host.
- Older names are mapped to the current ones (the renames table of fixtures/vllm/NOTES.md); when a
  server emits both, the older is dropped, so nothing is counted twice.
- Unknown labels and label values pass through untouched; several engines are just label values.
- `_created` samples are not sent: the counter hygiene (agent/hygiene.py) reads them to detect
  restarts.
- NaN and +/-Inf values are dropped and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvcore.exposition import Exposition, RawSample

# Families kept, as name prefixes (a prefix also keeps the family's _bucket/_sum/_count/_created).
KEEP_PREFIXES: tuple[str, ...] = (
    "vllm:prefix_cache_",
    "vllm:external_prefix_cache_",
    "vllm:prompt_tokens",  # _total, _by_source, _cached, _cached_by_source
    "vllm:generation_tokens_total",
    "vllm:kv_cache_usage_perc",
    "vllm:kv_offload_",  # all of them, incl. tiering per tier and kv_offload_config_info
    "vllm:cache_config_info",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    # the worth panel's prefill speed: recomputed tokens / prefill seconds, and its fallback
    # (TTFT - queue time) where a build lacks the prefill histogram
    "vllm:request_prefill_time_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:num_requests_",  # running, waiting, waiting_by_reason, kv_fetch_by_stage
    "vllm:num_preemptions",
    "vllm:request_success",
    "vllm:engine_sleep_state",
    "lmcache:",
    "process_start_time_seconds",
    # older names, renamed below
    "vllm:gpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_",
    "vllm:time_per_output_token_seconds",
)

# older family name -> current family name (types and every sample of the family)
FAMILY_RENAMES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
}
_SAMPLE_SUFFIXES = ("", "_total", "_created", "_bucket", "_sum", "_count")
SAMPLE_RENAMES: dict[str, str] = {
    old + suf: new + suf for old, new in FAMILY_RENAMES.items() for suf in _SAMPLE_SUFFIXES
}
# vllm:kv_offload_total_{bytes,time}_total{transfer_type} -> per-direction families
_TRANSFER_DIRECTION = {"CPU_to_GPU": "load", "GPU_to_CPU": "store"}
_SPLIT_OLD = ("vllm:kv_offload_total_bytes", "vllm:kv_offload_total_time")

BY_SOURCE_COUNTERS = frozenset({"vllm:prompt_tokens_by_source_total", "vllm:prompt_tokens_cached_by_source_total"})


@dataclass(slots=True)
class Normalised:
    samples: list[RawSample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    created: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    process_start: float | None = None
    dropped_nonfinite: int = 0
    dropped_duplicates: int = 0
    renamed: int = 0  # older-name samples mapped to current names
    shadowed: int = 0  # older-name samples dropped because the current name was also there


def series_key(name: str, labels: dict[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
    # Label order as exposed: one server writes a series' labels in the same order every
    # scrape (and the same order for the older and current names), so no sort is needed.
    return name, tuple(labels.items())


def _split_transfer(name: str, labels: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    """vllm:kv_offload_total_bytes_total{transfer_type="CPU_to_GPU"} -> vllm:kv_offload_load_bytes_total."""
    for old in _SPLIT_OLD:
        if name.startswith(old):
            direction = _TRANSFER_DIRECTION.get(labels.get("transfer_type", ""))
            if direction is None:
                return None  # an unknown direction passes through under its own name
            what = old.rsplit("_", 1)[1]  # bytes | time
            rest = name[len(old) :]
            new_labels = {k: v for k, v in labels.items() if k != "transfer_type"}
            return f"vllm:kv_offload_{direction}_{what}{rest}", new_labels
    return None


def normalise(exp: Exposition) -> Normalised:
    out = Normalised()
    # Current-name series present in the text: an older-name twin of one of these is dropped.
    current: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    older: list[tuple[str, dict[str, str], float]] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    samples = out.samples
    for name, labels, value in exp.samples:
        if name.endswith("_created"):
            if math.isfinite(value):
                out.created[series_key(name[:-8], labels)] = value
            continue
        if name == "process_start_time_seconds" and math.isfinite(value):
            out.process_start = value
        if name in SAMPLE_RENAMES or name.startswith(_SPLIT_OLD):
            older.append((name, labels, value))
            continue
        if not math.isfinite(value):
            out.dropped_nonfinite += 1
            continue
        key = series_key(name, labels)
        if key in seen:
            out.dropped_duplicates += 1
            continue
        seen.add(key)
        current.add(key)
        samples.append((name, labels, value))
    for name, labels, value in older:
        new_name = SAMPLE_RENAMES.get(name)
        if new_name is not None:
            new_labels = labels
        else:
            split = _split_transfer(name, labels)
            if split is None:
                new_name, new_labels = name, labels
            else:
                new_name, new_labels = split
        key = series_key(new_name, new_labels)
        if key in current:
            out.shadowed += 1
            continue
        if not math.isfinite(value):
            out.dropped_nonfinite += 1
            continue
        if key in seen:
            out.dropped_duplicates += 1
            continue
        seen.add(key)
        if new_name != name:
            out.renamed += 1
        samples.append((new_name, new_labels, value))
    for fam, mtype in exp.types.items():
        if fam.endswith("_created"):
            continue
        new = FAMILY_RENAMES.get(fam, fam)
        if fam in _SPLIT_OLD:
            for direction in ("load", "store"):
                what = fam.rsplit("_", 1)[1]
                out.types.setdefault(f"vllm:kv_offload_{direction}_{what}", mtype)
            if any(n.startswith(fam) for n, _l, _v in samples):  # unknown transfer types, old name
                out.types.setdefault(fam, mtype)
            continue
        if new != fam and new in exp.types:
            continue
        out.types[new] = mtype
    return out
