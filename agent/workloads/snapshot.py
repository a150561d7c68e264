"""Counter snapshots of vLLM's /metrics before and after a run, and what changed in between.

Names are normalised the agent's way (older names mapped to current ones, never both). Samples
are summed over label sets that do not matter here (engine, model_name), kept apart by the labels
that do (source, le). A counter that went down between the snapshots (the server restarted
mid-run) makes the delta invalid: it is flagged, not reported as a negative number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent.exposition import parse
from agent.normalise import normalise

GIB = 1024**3

COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:kv_offload_load_bytes_total",
    "vllm:kv_offload_load_time_total",
    "vllm:kv_offload_store_bytes_total",
    "vllm:kv_offload_store_time_total",
    "vllm:num_preemptions_total",
)
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds")
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


@dataclass
class Snapshot:
    counters: dict[str, float] = field(default_factory=dict)
    by_source: dict[str, float] = field(default_factory=dict)
    # histogram family -> {le: cumulative count}, plus its _sum and _count
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    hist_sum: dict[str, float] = field(default_factory=dict)
    hist_count: dict[str, float] = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)
    kv_cache_usage: float | None = None


def read_snapshot(client: httpx.Client, base_url: str, timeout_s: float = 10.0) -> Snapshot:
    """Scrape /metrics (plain text Accept header). Raises httpx.HTTPError on failure."""
    r = client.get(base_url.rstrip("/") + "/metrics", headers={"Accept": "text/plain"}, timeout=timeout_s)
    r.raise_for_status()
    return parse_snapshot(r.text)


def parse_snapshot(text: str) -> Snapshot:
    norm = normalise(parse(text, keep=("vllm:",)))
    snap = Snapshot()
    for name, labels, value in norm.samples:
        if not math.isfinite(value):
            continue
        if name in COUNTERS:
            snap.counters[name] = snap.counters.get(name, 0.0) + value
        elif name == BY_SOURCE:
            src = labels.get("source", "")
            snap.by_source[src] = snap.by_source.get(src, 0.0) + value
        elif name == "vllm:cache_config_info" and not snap.cache_config:
            snap.cache_config = {k: v for k, v in labels.items() if k not in ("engine", "model_name")}
        elif name == "vllm:kv_cache_usage_perc":
            snap.kv_cache_usage = value
        else:
            for fam in HISTOGRAMS:
                if not name.startswith(fam):
                    continue
                rest = name[len(fam) :]
                if rest == "_bucket":
                    try:
                        le = float(labels.get("le", "nan"))
                    except ValueError:
                        continue
                    if math.isnan(le):
                        continue
                    b = snap.buckets.setdefault(fam, {})
                    b[le] = b.get(le, 0.0) + value
                elif rest == "_sum":
                    snap.hist_sum[fam] = snap.hist_sum.get(fam, 0.0) + value
                elif rest == "_count":
                    snap.hist_count[fam] = snap.hist_count.get(fam, 0.0) + value
    return snap


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts: linear within the bucket."""
    items = sorted(buckets.items())
    if not items or items[-1][1] <= 0:
        return None
    total = items[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in items:
        if count >= rank:
            if math.isinf(le):
                return prev_le  # the highest finite bound, as Prometheus does
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def delta(before: Snapshot, after: Snapshot, elapsed_s: float) -> dict[str, Any]:
    """What the server counted during the run: tokens by source and shares, hit rates, transfer
    GB and GB/s, preemptions, server-side TTFT/ITL quantiles of the run, configured pinned bytes."""
    out: dict[str, Any] = {"valid": True, "problems": []}

    def d(a: float | None, b: float | None, name: str) -> float | None:
        if b is None:
            return None
        x = b - (a or 0.0)
        if x < 0:
            out["valid"] = False
            out["problems"].append(f"{name} went down during the run (server restarted?)")
            return None
        return x

    c: dict[str, float | None] = {}
    for name in COUNTERS:
        c[name] = d(before.counters.get(name), after.counters.get(name), name)
    src: dict[str, float] = {}
    for s in set(after.by_source) | set(before.by_source):
        v = d(before.by_source.get(s), after.by_source.get(s), f"{BY_SOURCE}{{source={s}}}")
        if v is not None:
            src[s] = v
    out["prompt_tokens"] = c["vllm:prompt_tokens_total"]
    out["generation_tokens"] = c["vllm:generation_tokens_total"]
    out["tokens_by_source"] = src
    total_src = sum(src.values())
    out["share_by_source"] = {s: (v / total_src) for s, v in src.items()} if total_src > 0 else {}
    out["gpu_hit_rate"] = _ratio(c["vllm:prefix_cache_hits_total"], c["vllm:prefix_cache_queries_total"])
    out["external_hit_rate"] = _ratio(
        c["vllm:external_prefix_cache_hits_total"], c["vllm:external_prefix_cache_queries_total"]
    )
    cached = (src.get("local_cache_hit", 0.0) + src.get("external_kv_transfer", 0.0)) if src else None
    out["overall_hit_rate"] = _ratio(cached, out["prompt_tokens"])
    for direction in ("load", "store"):
        b = c[f"vllm:kv_offload_{direction}_bytes_total"]
        t = c[f"vllm:kv_offload_{direction}_time_total"]
        out[f"{direction}_bytes"] = b
        out[f"{direction}_time_s"] = t
        out[f"{direction}_gbps"] = (b / t / 1e9) if b is not None and t else None
    out["preemptions"] = c["vllm:num_preemptions_total"]
    out["server"] = {}
    for fam in HISTOGRAMS:
        ba, bb = before.buckets.get(fam, {}), after.buckets.get(fam)
        if not bb:
            continue
        diff = {le: bb[le] - ba.get(le, 0.0) for le in bb}
        if any(v < 0 for v in diff.values()):
            out["valid"] = False
            out["problems"].append(f"{fam} went down during the run")
            continue
        key = "ttft" if "first_token" in fam else "itl"
        count = after.hist_count.get(fam, 0.0) - before.hist_count.get(fam, 0.0)
        total = after.hist_sum.get(fam, 0.0) - before.hist_sum.get(fam, 0.0)
        out["server"][key] = {
            "count": count,
            "mean_s": (total / count) if count > 0 else None,
            **{f"p{q}_s": histogram_quantile(q / 100.0, diff) for q in (50, 95, 99)},
        }
    out["elapsed_s"] = elapsed_s
    out["generation_tokens_per_s"] = (
        out["generation_tokens"] / elapsed_s if out["generation_tokens"] is not None and elapsed_s > 0 else None
    )
    out["configured_offload_bytes"] = configured_offload_bytes(after.cache_config)
    out["cache_config"] = after.cache_config
    return out


def configured_offload_bytes(cache_config: dict[str, str]) -> int | None:
    """The pinned CPU buffer the server was started with, from cache_config_info (GiB as str)."""
    raw = cache_config.get("kv_offloading_size")
    if raw is None:
        return None
    if raw in ("None", ""):
        return 0
    try:
        v = float(raw)
    except ValueError:
        return None
    return int(v * GIB) if math.isfinite(v) and v >= 0 else None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return num / den
