"""The seven charts of the instance page, as Panels (data only; app.charts draws them)."""

from __future__ import annotations

from collections.abc import Callable

from app.charts import palette
from app.derived.engine_charts import with_engine_names
from app.derived.grid import Grid
from app.derived.grid_math import (
    add,
    counter_rate,
    gauge_values,
    quantile_series,
    scale,
    sum_by,
    total,
)
from app.derived.panels import Panel, Scope, Trace, offload_capacity_bytes, offload_size_bytes, offload_tier
from app.derived.pcie import link_ceiling_gbps
from app.derived.series_reader import TieredSeries
from kvcore import kv_vocabulary as kv
from kvcore.series import Values, ratio

GIB = float(2**30)
NO_OFFLOAD = "no CPU offload configured (kv_offloading_size not set)"
HYBRID_BLOCK_SIZE = 256  # attention block sizes at or above this are the hybrid models' floor


def _no_data_reason(scope: Scope, what: str) -> str:
    if scope.state == "stale":
        return f"agent stale: no push from this host recently, so no {what} in this range"
    if scope.state == "down":
        return f"instance down: no {what} in this range"
    if scope.state == "gone":
        return f"its agent no longer scrapes this instance: no {what} in this range"
    return f"no {what} in this range (the server does not expose it, or nothing was recorded yet)"


def _finish(panel: Panel, scope: Scope, what: str) -> Panel:
    if panel.empty is None and not panel.has_data():
        panel.empty = _no_data_reason(scope, what)
    return panel


def _window(g: Grid) -> float:
    """The span each point sums: the rate window on raw samples, the step on rollups."""
    return g.rate_window if g.tier == "raw" else g.step


def _span(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def _window_note(g: Grid) -> str:
    return f"Each point: the counters' increase over the {_span(_window(g))} before it / that time."


def tokens_by_source(scope: Scope) -> Panel:
    g = scope.grid
    p = Panel("tokens", "Prompt tokens by source", g, ["tokens/s"])
    got = scope.fetch([kv.BY_SOURCE, kv.CACHED_BY_SOURCE])
    by_src = sum_by(got[kv.BY_SOURCE], "source", g, counter_rate)
    tier = offload_tier(scope)
    for src in kv.SOURCES:
        if src.vllm_label in by_src:
            vals = by_src.pop(src.vllm_label)
            name = kv.source_label(src.vllm_label, tier)
            p.traces.append(Trace(name, vals, "tokens/s", style="area", color=src.color, group="src"))
    for i, (label, vals) in enumerate(sorted(by_src.items())):  # unknown sources pass through
        color = palette.OTHER_SOURCE_COLORS[i % len(palette.OTHER_SOURCE_COLORS)]
        p.traces.append(Trace(kv.source_label(label), vals, "tokens/s", style="area", color=color, group="src"))
    tiers = sum_by(got[kv.CACHED_BY_SOURCE], "source", g, counter_rate)
    moved = {name: vals for name, vals in sorted(tiers.items()) if any(v for v in vals)}  # all-zero tiers: noise
    for i, (tier_name, vals) in enumerate(moved.items()):
        color = palette.GPU_CYCLE[i % len(palette.GPU_CYCLE)]
        p.traces.append(Trace(f"cached from {tier_name}", vals, "tokens/s", style="dot", color=color))
    if tiers:
        p.notes.append("Dotted: cached prompt tokens per tier (device / host / disk ...), as the server reports.")
    p.notes.append(_window_note(g))
    return _finish(p, scope, "prompt_tokens_by_source samples")


def hit_rates(scope: Scope) -> Panel:
    g = scope.grid
    p = Panel("hitrates", "Hit rates (vLLM's definitions)", g, ["hit rate (%)"], y_ranges={0: (0.0, 100.0)})
    names = sorted({n for fams in kv.HIT_RATE_FAMILIES.values() for n in fams})
    got = scope.fetch(names)

    def r(name: str) -> Values | None:
        return total(got[name], g, counter_rate)

    for d in (kv.HIT_GPU, kv.HIT_OFFLOAD):
        h, q = r(d.hits), r(d.queries)
        if h is not None and q is not None:
            p.traces.append(Trace(d.label, ratio(h, q, 100.0), "%", color=d.color))
    by_src: dict[str, Values] | None = None

    def sources(labels: frozenset[str] | None) -> Values | None:
        nonlocal by_src
        if by_src is None:
            by_src = sum_by(got[kv.BY_SOURCE], "source", g, counter_rate)
        parts = [v for k, v in by_src.items() if labels is None or k in labels]
        return add(parts) if parts else None

    cached, prompt = kv.overall_terms(r, sources)
    if cached is not None and prompt is not None:
        d = kv.HIT_OVERALL
        p.traces.append(Trace(d.label, ratio(cached, prompt, 100.0), "%", color=d.color, style="dash"))
    bs = (scope.instance.get("cache_config") or {}).get("block_size")
    try:
        block = int(str(bs))
    except ValueError:
        block = 0
    if block >= HYBRID_BLOCK_SIZE:
        p.notes.append(
            f"block_size is {block} tokens (hybrid model): a shared prefix shorter than {block} tokens "
            "never hits, so a low hit rate here is not necessarily a regression."
        )
    p.notes.append(kv.HIT_RATE_NOTE)
    p.notes.append(
        f"Each point is the ratio of the counters' increases over the {_span(_window(g))} before it "
        "(not a mean of per-second ratios)."
    )
    return _finish(p, scope, "prefix-cache counters")


def _host_latest(scope: Scope, name: str, where: Callable[[TieredSeries], bool]) -> float | None:
    best: float | None = None
    for s in scope.fetch([name], host=True)[name]:
        if not where(s):
            continue
        vals = [v for v in gauge_values(s, scope.grid, "max") if v is not None]
        if vals:
            best = max(vals) if best is None else max(best, max(vals))
    return best


def transfer(scope: Scope) -> Panel:
    g = scope.grid
    p = Panel("transfer", "KV transfer (CPU offload)", g, [f"GB/s, {_span(_window(g))} average"])
    got = scope.fetch(["vllm:kv_offload_load_bytes_total", "vllm:kv_offload_store_bytes_total"])
    load = total(got["vllm:kv_offload_load_bytes_total"], g, counter_rate)
    store = total(got["vllm:kv_offload_store_bytes_total"], g, counter_rate)
    if load is None and store is None:
        if offload_size_bytes(scope.instance) is None:
            p.empty = NO_OFFLOAD + ": nothing moves between GPU and CPU"
        else:
            p.empty = "offload is configured but the server exposes no kv_offload_*_bytes counters"
        return p
    if load is not None:
        p.traces.append(Trace("load CPU->GPU", scale(load, 1e-9), "GB/s", color=palette.TRANSFER["load"]))
    if store is not None:
        p.traces.append(Trace("store GPU->CPU", scale(store, 1e-9), "GB/s", color=palette.TRANSFER["store"]))
    p.notes.append(
        f"GB/s here = bytes moved in each {_span(_window(g))} window / the window, all workers together: idle "
        "time counts. The worth panel's load speed is bytes / the seconds transfers ran, per worker, so it "
        "is much higher than this average."
    )
    gen = _host_latest(scope, "kvscope:gpu_pcie_link_gen", lambda s: s.labels.get("kind") == "max")
    width = _host_latest(scope, "kvscope:gpu_pcie_link_width", lambda s: s.labels.get("kind") == "max")
    ceiling = link_ceiling_gbps(gen, width)
    if ceiling is not None:
        p.hlines.append((0, ceiling, f"PCIe gen{int(gen or 0)} x{int(width or 0)} ceiling {ceiling:.1f} GB/s"))
    else:
        p.notes.append("PCIe ceiling unknown: no GPU link readings from this host.")
    return _finish(p, scope, "transfer counters")


def _host_sum(scope: Scope, name: str, use: str = "mean") -> Values | None:
    series = scope.fetch([name], host=True)[name]
    return total(series, scope.grid, lambda s, gr: gauge_values(s, gr, use)) if series else None


def pinned_memory(scope: Scope) -> Panel:
    g = scope.grid
    p = Panel("pinned", "Pinned host memory", g, ["GiB"])
    configured = offload_size_bytes(scope.instance)
    if configured is not None:
        p.traces.append(
            Trace(
                "configured offload size",
                [configured / GIB] * len(g.times),
                "GiB",
                style="dash",
                color=palette.PINNED["configured"],
            )
        )
    for name, label, color in (
        ("kvscope:pinned_offload_file_bytes", "shm offload files (size)", palette.PINNED["file"]),
        ("kvscope:pinned_offload_resident_bytes", "shm offload files (resident)", palette.PINNED["resident"]),
        ("kvscope:pinned_vllm_rss_shmem_bytes", "vLLM RssShmem", palette.PINNED["rss_shmem"]),
    ):
        v = _host_sum(scope, name)
        if v is not None:
            p.traces.append(Trace(label, scale(v, 1 / GIB), "GiB", color=color))
    limit = _host_sum(scope, "kvscope:cgroup_memory_limit_bytes")
    limit_label = "cgroup memory limit"
    used: Values | None = _host_sum(scope, "kvscope:cgroup_memory_current_bytes")
    if limit is None or all(v is None for v in limit):
        limit = _host_sum(scope, "kvscope:host_memory_total_bytes")
        limit_label = "MemTotal"
        avail = _host_sum(scope, "kvscope:host_memory_available_bytes")
        used = None
        if limit is not None and avail is not None:
            used = [a - b if a is not None and b is not None else None for a, b in zip(limit, avail, strict=True)]
    if limit is not None:
        p.traces.append(Trace(limit_label, scale(limit, 1 / GIB), "GiB", color=palette.PINNED["limit"], style="dash"))
        if used is not None:
            head = [a - b if a is not None and b is not None else None for a, b in zip(limit, used, strict=True)]
            p.traces.append(
                Trace(
                    "headroom (limit - used)",
                    scale(head, 1 / GIB),
                    "GiB",
                    color=palette.PINNED["headroom"],
                    style="dot",
                    derived=True,
                )
            )
    if not p.has_data() and configured is None:
        p.empty = NO_OFFLOAD + " and no host memory readings"
    p.notes.append("Host-level readings: shared by every vLLM instance on this host.")
    return _finish(p, scope, "host memory readings")


def tier_occupancy(scope: Scope) -> Panel:
    g = scope.grid
    p = Panel("tiers", "Tier occupancy", g, ["occupancy (%)"], y_ranges={0: (0.0, 105.0)})
    got = scope.fetch(
        [
            "vllm:kv_cache_usage_perc",
            "vllm:kv_offload_cpu_cache_usage_perc",
            "vllm:kv_offload_store_bytes_total",
        ]
    )
    gpu = total(got["vllm:kv_cache_usage_perc"], g, gauge_values)
    if gpu is not None:
        p.traces.append(Trace("GPU KV pool usage", scale(gpu, 100.0), "%", color=palette.TIERS["gpu"]))
    pin = total(got["vllm:kv_offload_cpu_cache_usage_perc"], g, gauge_values)
    if pin is not None:
        p.traces.append(
            Trace(
                "CPU tier pinned by in-flight transfers (vLLM gauge)",
                scale(pin, 100.0),
                "%",
                color=palette.TIERS["cpu_pinned"],
            )
        )
    cap = offload_capacity_bytes(scope.instance)
    stored = total(got["vllm:kv_offload_store_bytes_total"], g, lambda s, gr: gauge_values(s, gr, "last"))
    if cap is not None and stored is not None:
        fill = [min(100.0, 100.0 * v / cap) if v is not None else None for v in stored]
        p.traces.append(
            Trace(
                "CPU tier fill estimate (derived)",
                fill,
                "%",
                style="dash",
                color=palette.TIERS["cpu_fill"],
                derived=True,
            )
        )
        p.notes.append(
            "Derived: bytes stored since the server started / CPU-tier capacity, capped at 100 % "
            "(LRU evicts once full). vLLM exports no residency gauge."
        )
    if gpu is None and pin is None and cap is None:
        p.empty = _no_data_reason(scope, "KV usage gauges")
    p.notes.append("GPU usage counts cached-but-free prefix blocks as free: it is not prefix-cache occupancy.")
    return _finish(p, scope, "KV usage gauges")


def latency(scope: Scope) -> Panel:
    g = scope.grid
    p = Panel("latency", "Latency and load", g, ["latency (ms)", "requests", "preemptions/s"])
    got = {
        **scope.fetch_counters(["vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket"]),
        **scope.fetch(["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total"]),
    }
    ttft = quantile_series(got["vllm:time_to_first_token_seconds_bucket"], (0.5, 0.95, 0.99), g)
    if got["vllm:time_to_first_token_seconds_bucket"]:
        for q, vals in ttft.items():
            p.traces.append(Trace(f"TTFT p{round(q * 100)}", scale(vals, 1000.0), "ms", color=palette.TTFT[q]))
    if got["vllm:inter_token_latency_seconds_bucket"]:
        itl = quantile_series(got["vllm:inter_token_latency_seconds_bucket"], (0.5, 0.95), g)
        for q, vals in itl.items():
            p.traces.append(
                Trace(f"ITL p{round(q * 100)}", scale(vals, 1000.0), "ms", style="dot", color=palette.ITL[q])
            )
    for name, label, color in (
        ("vllm:num_requests_running", "running", palette.LOAD["running"]),
        ("vllm:num_requests_waiting", "waiting", palette.LOAD["waiting"]),
    ):
        v = total(got[name], g, gauge_values)
        if v is not None:
            p.traces.append(Trace(label, v, "requests", row=1, color=color))
    pre = total(got["vllm:num_preemptions_total"], g, counter_rate)
    if pre is not None:
        p.traces.append(Trace("preemptions", pre, "1/s", row=2, color=palette.LOAD["preemptions"]))
    p.notes.append("Quantiles from histogram bucket rates (histogram_quantile); bucket bounds limit precision.")
    return _finish(p, scope, "latency histograms")


def gpu(scope: Scope) -> Panel:
    g = scope.grid
    p = Panel("gpu", "GPU", g, ["memory (GiB)", "utilization (%)", "PCIe (GB/s)"])
    count = _host_latest(scope, "kvscope:gpu_count", lambda s: True)
    if count is not None and count <= 0:
        p.empty = "no GPU on this host (the agent found none: gpu_count = 0)"
        return p
    got = scope.fetch(
        [
            "kvscope:gpu_memory_used_bytes",
            "kvscope:gpu_memory_total_bytes",
            "kvscope:gpu_utilization_ratio",
            "kvscope:gpu_pcie_rx_bytes_per_second",
            "kvscope:gpu_pcie_tx_bytes_per_second",
        ],
        host=True,
    )
    mine = instance_gpus(scope)
    for name, label, row, k, style in (
        ("kvscope:gpu_memory_used_bytes", "used", 0, 1 / GIB, "line"),
        ("kvscope:gpu_memory_total_bytes", "total", 0, 1 / GIB, "dash"),
        ("kvscope:gpu_utilization_ratio", "utilization", 1, 100.0, "line"),
        ("kvscope:gpu_pcie_rx_bytes_per_second", "PCIe rx host->GPU", 2, 1e-9, "line"),
        ("kvscope:gpu_pcie_tx_bytes_per_second", "PCIe tx GPU->host", 2, 1e-9, "dot"),
    ):
        for s in sorted(got[name], key=lambda s: s.labels.get("gpu", "")):
            idx = s.labels.get("gpu", "?")
            if mine and idx not in mine:
                continue  # another instance's GPU on the same host
            unit = p.rows[row].split("(")[-1].rstrip(")")
            color = palette.gpu_color(int(idx)) if idx.isdigit() else palette.GREY
            p.traces.append(
                Trace(f"GPU{idx} {label}", scale(gauge_values(s, g), k), unit, row=row, style=style, color=color)
            )
    if mine:
        p.notes.append(
            f"GPU{'s' if len(mine) > 1 else ''} {', '.join(sorted(mine))} of this host: the ones this instance's "
            "processes use (the agent matched them by the port it listens on)."
        )
    else:
        p.notes.append("Every GPU of the host: the agent could not tell which ones this instance uses.")
    if not p.has_data() and count is None:
        p.empty = (
            _no_data_reason(scope, "GPU readings")
            if scope.state == "stale"
            else "no GPU readings from this host's agent (no NVML / nvidia-smi)"
        )
    return _finish(p, scope, "GPU readings")


INSTANCE_GPU = "kvscope:instance_gpu"  # agent/instance_gpus.py: 1 per GPU the instance's processes use


def instance_gpus(scope: Scope) -> set[str]:
    """GPU indices the agent saw this instance use during the range (empty: unknown)."""
    return {
        str(s.labels.get("gpu"))
        for s in scope.fetch([INSTANCE_GPU])[INSTANCE_GPU]
        if s.labels.get("gpu") is not None and any(v for v in gauge_values(s, scope.grid, "max"))
    }


CHARTS: dict[str, Callable[[Scope], Panel]] = {
    "tokens": tokens_by_source,
    "hitrates": hit_rates,
    "transfer": transfer,
    "pinned": pinned_memory,
    "tiers": tier_occupancy,
    "latency": latency,
    "gpu": gpu,
}
# engine and tier names for endpoints read by an engine reader (app/derived/engine_charts.py)
CHARTS = with_engine_names(CHARTS)
