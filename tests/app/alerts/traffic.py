"""A vLLM-shaped traffic model for alert tests: cumulative counters as a simulator run exposes them
(prompt tokens by source, GPU and external prefix-cache queries/hits, prompt-length and TTFT
histograms, offload bytes), advanced phase by phase, with restarts that reset every counter.

Consistent with vLLM's invariants (fixtures/vllm/NOTES.md): by_source sums to prompt_tokens,
GPU queries = prompt tokens, GPU hits = local_cache_hit, external queries = prompt - GPU hits,
external hits = external_kv_transfer. Values are exact (no randomness) so tests can compute the
expected hit rates by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LABELS = {"model_name": "m", "engine": "0"}
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"))
LEN_BUCKETS = (128.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, float("inf"))
BYTES_PER_TOKEN = 147_456.0
TYPES = {
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:request_success": "counter",
    "vllm:kv_offload_store_bytes": "counter",
    "vllm:kv_offload_load_bytes": "counter",
    "vllm:kv_offload_allocation_failure": "counter",
    "vllm:cache_config_info": "gauge",
}


@dataclass(frozen=True)
class Mix:
    """Traffic per second: requests, prompt length, share of prompt tokens from the GPU cache and
    from the offload tier, TTFT of every request, bytes stored to the tier per second."""

    rps: float = 2.0
    prompt_len: float = 2000.0
    gpu_hit: float = 0.5
    ext_hit: float = 0.1
    ttft_s: float = 0.2
    store_bytes_per_s: float = 0.0
    alloc_failures_per_s: float = 0.0
    # prompt lengths as (tokens, share of requests); default: every prompt is prompt_len long
    lengths: tuple[tuple[float, float], ...] = ()

    def length_shares(self) -> tuple[tuple[float, float], ...]:
        return self.lengths or ((self.prompt_len, 1.0),)


HEALTHY = Mix()
UNIQUE = Mix(gpu_hit=0.0, ext_hit=0.0, ttft_s=0.6)
COLD = Mix(gpu_hit=0.0, ext_hit=0.0, ttft_s=0.6)


@dataclass
class Server:
    block_size: str = "16"
    offload_gib: str = "8"
    counters: dict[str, float] = field(default_factory=dict)

    def restart(self) -> None:
        self.counters = {}

    def _add(self, key: str, v: float) -> None:
        self.counters[key] = self.counters.get(key, 0.0) + v

    def advance(self, dt: float, mix: Mix) -> None:
        reqs = mix.rps * dt
        prompt = reqs * sum(n * share for n, share in mix.length_shares())
        for n, share in mix.length_shares():
            for le in LEN_BUCKETS:
                if n <= le:
                    self._add(f"len:{le}", reqs * share)
        gpu = prompt * mix.gpu_hit
        ext = prompt * mix.ext_hit
        self._add("prompt", prompt)
        self._add("src:local_cache_hit", gpu)
        self._add("src:external_kv_transfer", ext)
        self._add("src:local_compute", prompt - gpu - ext)
        self._add("gpu_q", prompt)
        self._add("gpu_h", gpu)
        self._add("ext_q", prompt - gpu)
        self._add("ext_h", ext)
        self._add("req", reqs)
        self._add("len_sum", prompt)
        self._add("ttft_sum", reqs * mix.ttft_s)
        for le in TTFT_BUCKETS:
            if mix.ttft_s <= le:
                self._add(f"ttft:{le}", reqs)
        self._add("store", mix.store_bytes_per_s * dt)
        self._add("load", ext * BYTES_PER_TOKEN)
        self._add("alloc_fail", mix.alloc_failures_per_s * dt)

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        c = self.counters.get
        out: list[tuple[str, dict[str, str], float]] = [
            ("vllm:prompt_tokens_total", LABELS, c("prompt", 0.0)),
            ("vllm:prefix_cache_queries_total", LABELS, c("gpu_q", 0.0)),
            ("vllm:prefix_cache_hits_total", LABELS, c("gpu_h", 0.0)),
            ("vllm:external_prefix_cache_queries_total", LABELS, c("ext_q", 0.0)),
            ("vllm:external_prefix_cache_hits_total", LABELS, c("ext_h", 0.0)),
            ("vllm:request_prompt_tokens_sum", LABELS, c("len_sum", 0.0)),
            ("vllm:request_prompt_tokens_count", LABELS, c("req", 0.0)),
            ("vllm:request_success_total", {**LABELS, "finished_reason": "stop"}, c("req", 0.0)),
            ("vllm:time_to_first_token_seconds_sum", LABELS, c("ttft_sum", 0.0)),
            ("vllm:time_to_first_token_seconds_count", LABELS, c("req", 0.0)),
            ("vllm:kv_offload_store_bytes_total", LABELS, c("store", 0.0)),
            ("vllm:kv_offload_load_bytes_total", LABELS, c("load", 0.0)),
            ("vllm:kv_offload_allocation_failure_total", LABELS, c("alloc_fail", 0.0)),
            (
                "vllm:cache_config_info",
                {
                    **LABELS,
                    "block_size": self.block_size,
                    "enable_prefix_caching": "True",
                    "kv_offloading_size": self.offload_gib,
                    "kv_offloading_backend": "native",
                },
                1.0,
            ),
        ]
        for src in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            out.append(("vllm:prompt_tokens_by_source_total", {**LABELS, "source": src}, c(f"src:{src}", 0.0)))
        for le in TTFT_BUCKETS:
            le_s = "+Inf" if le == float("inf") else str(le)
            out.append(("vllm:time_to_first_token_seconds_bucket", {**LABELS, "le": le_s}, c(f"ttft:{le}", 0.0)))
        for le in LEN_BUCKETS:
            le_s = "+Inf" if le == float("inf") else str(le)
            out.append(("vllm:request_prompt_tokens_bucket", {**LABELS, "le": le_s}, c(f"len:{le}", 0.0)))
        return out


def scrape(instance: str, ts: float, server: Server) -> dict[str, Any]:
    return {
        "instance": instance,
        "ts": ts,
        "ok": True,
        "healthy": True,
        "model": "m",
        "version": "0.33.0",
        "simulated": True,
        "types": TYPES,
        "samples": [{"name": n, "labels": lab, "value": v} for n, lab, v in server.samples()],
    }


def batch(
    seq: int, sent_at: float, scrapes: list[dict[str, Any]], *, host: str = "rig1", agent_id: str = "agent-1"
) -> dict[str, Any]:
    return {"agent_id": agent_id, "host": host, "seq": seq, "sent_at": sent_at, "scrapes": scrapes}
