"""Read a real server through the agent's own reader, and pick values out of its Scrape."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from agent.vllm_reader import VllmReader
from kvcore.protocol import Scrape
from tests.realvllm.workload import complete, prompt_tokens_of
from tests.waits import wait_until

# The families the dashboard, alerts and controller read, as the agent must send them
# (current names, counters with _total, histograms as _bucket/_sum/_count).
DASHBOARD_SAMPLES = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:prompt_tokens_by_source_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:prompt_tokens_cached_by_source_total",
    "vllm:generation_tokens_total",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
)
DASHBOARD_TYPES = {
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:num_requests_running": "gauge",
}
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


class Reading:
    """One Scrape, with lookups."""

    def __init__(self, scrape: Scrape) -> None:
        self.scrape = scrape

    def names(self) -> set[str]:
        return {s.name for s in self.scrape.samples}

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0.0 when none)."""
        return sum(
            s.value
            for s in self.scrape.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def labels_of(self, name: str) -> dict[str, str]:
        for s in self.scrape.samples:
            if s.name == name:
                return dict(s.labels)
        raise AssertionError(f"{name} not in the scrape; names: {sorted(self.names())}")

    def by_source(self, source: str) -> float:
        return self.value("vllm:prompt_tokens_by_source_total", source=source)

    def snapshot(self) -> dict[str, float]:
        """The counters the prefix tests compare, by short name."""
        out = {f"src:{s}": self.by_source(s) for s in SOURCES}
        for name in (
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:external_prefix_cache_queries_total",
            "vllm:external_prefix_cache_hits_total",
            "vllm:prompt_tokens_total",
            "vllm:prompt_tokens_cached_total",
        ):
            out[name] = self.value(name)
        return out


def delta(after: Reading, before: Reading) -> dict[str, float]:
    a, b = after.snapshot(), before.snapshot()
    return {k: a[k] - b[k] for k in a}


class AgentView:
    """The agent's VllmReader pointed at a server, one client for the test's lifetime."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.Client()
        self.reader = VllmReader(base_url, self.client, timeout_s=30.0)
        self.events: list[Any] = []

    def read(self) -> Reading:
        scrape, events = self.reader.scrape(time.time())
        self.events.extend(events)
        assert scrape.ok, f"the agent could not read {scrape.instance}: {scrape.error}"
        return Reading(scrape)

    def close(self) -> None:
        self.client.close()


def read_until(agent: AgentView, ok: Callable[[Reading], bool], what: str, deadline_s: float = 30.0) -> Reading:
    """vLLM publishes stats from its output loop: the counters can trail the HTTP reply a little."""
    last: list[Reading] = []

    def seen() -> bool:
        last[:] = [agent.read()]
        return ok(last[0])

    try:
        wait_until(seen, what, timeout=deadline_s, interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {last[0].snapshot() if last else 'no reading'}") from None
    return last[0]


def send(base_url: str, agent: AgentView, prompt: list[int]) -> Reading:
    """One completion, then the agent's reading once the server has counted its prompt."""
    before = agent.read().value("vllm:prompt_tokens_total")
    reply = complete(base_url, prompt)
    assert prompt_tokens_of(reply) == len(prompt)
    return read_until(
        agent,
        lambda r: r.value("vllm:prompt_tokens_total") >= before + len(prompt),
        f"prompt_tokens_total += {len(prompt)}",
    )
