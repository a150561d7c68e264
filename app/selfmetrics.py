"""The app's own Prometheus metrics, in a private registry (never the global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest


class SelfMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.ingest_batches = Counter(
            "kvscope_ingest_batches", "Push batches received, by result", ["result"], registry=self.registry
        )
        self.ingest_samples = Counter("kvscope_ingest_samples", "Samples stored from agents", registry=self.registry)
        self.request_seconds = Histogram(
            "kvscope_http_request_duration_seconds",
            "HTTP request latency by route template and status class",
            ["route", "status"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
