"""'Is offload worth it?': over the selected range, what the CPU tier gave back and what it cost."""

from __future__ import annotations

from dataclasses import dataclass

from app.derived.panels import Scope, offload_size_bytes

NAMES = [
    "vllm:prompt_tokens_by_source_total",
    "vllm:kv_offload_load_bytes_total",
    "vllm:kv_offload_load_time_total",
    "vllm:kv_offload_store_bytes_total",
    "vllm:kv_offload_store_time_total",
    "vllm:request_prefill_time_seconds_sum",
]


@dataclass
class Worth:
    offload_configured: bool
    reloaded_tokens: float | None
    recomputed_tokens: float | None
    gpu_hit_tokens: float | None
    load_bytes: float | None
    load_seconds: float | None
    store_bytes: float | None
    load_gbps: float | None  # per worker, while transferring
    load_tokens_per_s: float | None
    prefill_tokens_per_s: float | None  # recomputed tokens / prefill seconds
    saved_seconds: float | None
    thrash_ratio: float | None  # share of stored bytes never loaded back
    verdict: str
    tone: str  # good | bad | neutral


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def compute_worth(scope: Scope) -> Worth:
    g = scope.grid
    got = scope.range_increases(NAMES, g.start, g.end)

    def inc(name: str, source: str | None = None) -> float | None:
        incs = [v for labels, v in got[name] if source is None or labels.get("source") == source]
        return sum(incs) if incs else None

    reloaded = inc("vllm:prompt_tokens_by_source_total", "external_kv_transfer")
    recomputed = inc("vllm:prompt_tokens_by_source_total", "local_compute")
    gpu_hit = inc("vllm:prompt_tokens_by_source_total", "local_cache_hit")
    load_b = inc("vllm:kv_offload_load_bytes_total")
    load_t = inc("vllm:kv_offload_load_time_total")
    store_b = inc("vllm:kv_offload_store_bytes_total")
    prefill_s = inc("vllm:request_prefill_time_seconds_sum")
    configured = offload_size_bytes(scope.instance) is not None or load_b is not None
    bps = _div(load_b, load_t)
    load_gbps = bps / 1e9 if bps is not None else None
    load_tps = _div(reloaded, load_t)
    prefill_tps = _div(recomputed, prefill_s)
    saved: float | None = None
    if reloaded is not None and prefill_tps is not None:
        saved = reloaded / prefill_tps - (load_t or 0.0)
    thrash = None
    if store_b is not None and store_b > 0:
        thrash = max(0.0, store_b - (load_b or 0.0)) / store_b
    verdict, tone = _verdict(configured, reloaded, saved, thrash, store_b, load_tps, prefill_tps)
    return Worth(
        configured,
        reloaded,
        recomputed,
        gpu_hit,
        load_b,
        load_t,
        store_b,
        load_gbps,
        load_tps,
        prefill_tps,
        saved,
        thrash,
        verdict,
        tone,
    )


def _verdict(
    configured: bool,
    reloaded: float | None,
    saved: float | None,
    thrash: float | None,
    stored: float | None,
    load_tps: float | None,
    prefill_tps: float | None,
) -> tuple[str, str]:
    if not configured:
        return "Offload is off on this instance: nothing to weigh.", "neutral"
    if not reloaded:
        if stored:
            return (f"Not earning its RAM here: {stored / 1e9:.2f} GB stored, no token reloaded in this range.", "bad")
        return "No offload traffic in this range: no verdict yet.", "neutral"
    if load_tps is not None and prefill_tps is not None and load_tps < prefill_tps:
        return (
            f"Costs more than it saves: reloading ran at {load_tps:,.0f} tok/s, slower than recomputing "
            f"({prefill_tps:,.0f} tok/s).",
            "bad",
        )
    if saved is not None and saved > 0:
        extra = f" ({thrash:.0%} of stored bytes never came back)" if thrash is not None else ""
        return f"Worth it: about {saved:,.1f} s of prefill saved by reloading {reloaded:,.0f} tokens{extra}.", "good"
    if saved is not None:
        return "Not worth it in this range: reloads did not save prefill time.", "bad"
    return (
        f"Reloaded {reloaded:,.0f} tokens; prefill speed unknown (no request_prefill_time histogram), "
        "so the time saved cannot be estimated.",
        "neutral",
    )
