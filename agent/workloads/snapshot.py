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

from kvcore import kv_vocabulary as kv
from kvcore.exposition import parse
from kvcore.normalise import normalise
from kvcore.series import histogram_quantile, share

GIB = 1024**3

COUNTERS = (
    kv.PROMPT_TOKENS,
    kv.CACHED,
    kv.GENERATION_TOKENS,
    kv.GPU_QUERIES,
    kv.GPU_HITS,
    kv.EXT_QUERIES,
    kv.EXT_HITS,
    kv.LOAD_BYTES,
    kv.LOAD_TIME,
    kv.STORE_BYTES,
    kv.STORE_TIME,
    kv.PREEMPTIONS,
    kv.REQUEST_SUCCESS,  # summed over finished_reason: requests the server finished
)
BY_SOURCE = kv.BY_SOURCE
HISTOGRAMS = (kv.TTFT, kv.ITL)
SOURCES = tuple(src.vllm_label for src in (kv.RECOMPUTE, kv.GPU_HIT, kv.OFFLOAD_RELOAD))


@dataclass
class Snapshot:
    counters: dict[str, float] = field(default_factory=dict)
    by_source: dict[str, float] = field(default_factory=dict)
    # histogram family -> {le: cumulative count}, plus its _sum and _count
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    hist_sum: dict[str, float] = field(default_factory=dict)
    hist_count: dict[str, float] = field(default_factory=dict)
    cache_config: dict[str, str] = field(default_factory=dict)
    offload_config: dict[str, str] = field(default_factory=dict)  # vllm:kv_offload_config_info labels
    kv_connector: bool = False  # vllm:num_requests_kv_fetch_by_stage: a KV connector loads asynchronously
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
        elif name == kv.CACHE_CONFIG_INFO and not snap.cache_config:
            snap.cache_config = {k: v for k, v in labels.items() if k not in ("engine", "model_name")}
        elif name == kv.OFFLOAD_CONFIG_INFO and not snap.offload_config:
            snap.offload_config = {k: v for k, v in labels.items() if k not in ("engine", "model_name")}
        elif name == kv.KV_FETCH_BY_STAGE:
            snap.kv_connector = True
        elif name == kv.KV_CACHE_USAGE:
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
    out["prompt_tokens"] = c[kv.PROMPT_TOKENS]
    out["generation_tokens"] = c[kv.GENERATION_TOKENS]
    out["tokens_by_source"] = src
    total_src = sum(src.values())
    out["share_by_source"] = {s: share(v, total_src) for s, v in src.items()} if total_src > 0 else {}
    rates = kv.hit_rates(c, src)
    out.update(rates.by_run_key())  # gpu_hit_rate, external_hit_rate (the offload rate), overall_hit_rate
    for direction in ("load", "store"):
        b = c[kv.OFFLOAD_BYTES[direction]]
        t = c[kv.OFFLOAD_TIME[direction]]
        out[f"{direction}_bytes"] = b
        out[f"{direction}_time_s"] = t
        out[f"{direction}_gbps"] = (b / t / 1e9) if b is not None and t else None
    out["preemptions"] = c[kv.PREEMPTIONS]
    out["requests_finished"] = c[kv.REQUEST_SUCCESS]
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
        key = "ttft" if fam == kv.TTFT else "itl"
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


def foreign_traffic(counters: dict[str, Any] | None, sent: list[dict[str, Any]]) -> dict[str, Any]:
    """What the server served during the run that the run did not send: requests it finished
    (vllm:request_success_total) beyond the run's answered requests, and prompt tokens beyond the
    run's own (usage of each answer). None where a counter or a usage figure is missing."""
    c = counters or {}
    ours_ok = [r for r in sent if isinstance(r, dict) and r.get("ok") and r.get("tag") != "warmup"]
    out: dict[str, Any] = {"sent": len(ours_ok), "requests": None, "prompt_tokens": None}
    finished = c.get("requests_finished")
    if isinstance(finished, int | float):
        out["requests"] = max(0, round(finished) - len(ours_ok))
    total = c.get("prompt_tokens")
    own = [r.get("prompt_tokens") for r in ours_ok]
    if isinstance(total, int | float) and own and all(isinstance(t, int) for t in own):
        out["prompt_tokens"] = max(0, round(total) - sum(int(t) for t in own if isinstance(t, int)))
        out["prompt_token_share"] = out["prompt_tokens"] / total if total > 0 else 0.0
    if out["requests"] is not None:
        seen = out["requests"] + len(ours_ok)
        out["request_share"] = out["requests"] / seen if seen else 0.0
    return out


def tier_capacities(
    cache_config: dict[str, str], offload_config: dict[str, str], kv_connector: bool = False
) -> list[dict[str, Any]]:
    """The server's offload tiers and what each holds in tokens, as far as its metrics say:
    the native CPU tier from kv_offload_config_info (chunks x chunk tokens), else from
    cache_config_info's kv_offloading_size (GiB) at the GPU pool's bytes per token; secondary
    tiers (fs: disk) are listed with no size (bounded by the disk, not by the probe), and so is a KV
    connector seen only by its async-load gauge (ExampleConnector on disk, LMCache)."""
    tiers: list[dict[str, Any]] = []
    chunks, chunk_tokens = _num(offload_config.get("cpu_num_chunks")), _num(offload_config.get("offload_block_size"))
    if chunks is not None and chunk_tokens is not None and chunks > 0:
        tiers.append(
            {"name": "CPU", "tokens": int(chunks * chunk_tokens), "source": "kv_offload_config_info (cpu_num_chunks)"}
        )
    else:
        size = configured_offload_bytes(cache_config)
        pool_bytes, pool_tok = (
            _num(cache_config.get("kv_cache_memory_bytes")),
            _num(cache_config.get("kv_cache_size_tokens")),
        )
        if size:
            tokens = int(size / (pool_bytes / pool_tok)) if pool_bytes and pool_tok else None
            tiers.append(
                {
                    "name": "CPU",
                    "tokens": tokens,
                    "source": "cache_config_info (kv_offloading_size"
                    + (" at the GPU pool's bytes per token)" if tokens is not None else "; bytes per token unknown)"),
                }
            )
    for spec in str(offload_config.get("secondary_tiers") or "").split(","):
        kind, _, root = spec.partition(":")
        if kind and kind != "None":
            tiers.append({"name": kind, "tokens": None, "source": f"kv_offload_config_info ({kind} at {root})"})
    if kv_connector and not tiers:  # e.g. ExampleConnector (disk) or LMCache: its size is not in /metrics
        tiers.append({"name": "external KV connector", "tokens": None, "source": kv.KV_FETCH_BY_STAGE})
    return tiers


def _num(raw: str | None) -> float | None:
    try:
        v = float(str(raw))
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


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
