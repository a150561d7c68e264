"""A recorded sequence of scrapes: a deterministic workload on one instance with CPU offload, as
wire batches (plain dicts) with irregular scrape gaps and a restart (counters back to zero).

Shared by the dashboard tests, the truth test and the browser tests (import as
tests.app.dashboard.recorded). Values are made up by this generator and labelled so: they are test
input, never shown as real measurements.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import api_token

TTFT_LE = [
    "0.001",
    "0.005",
    "0.01",
    "0.02",
    "0.04",
    "0.06",
    "0.08",
    "0.1",
    "0.25",
    "0.5",
    "0.75",
    "1.0",
    "2.5",
    "5.0",
    "10.0",
    "+Inf",
]
ITL_LE = ["0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "+Inf"]
TTFT_BOUNDS = [float(le) for le in TTFT_LE]
ITL_BOUNDS = [float(le) for le in ITL_LE]
BYTES_PER_TOKEN = 147_456
ID = {"model_name": "qwen3-8b", "engine": "0"}
CACHE_CONFIG = {
    **ID,
    "block_size": "16",
    "cache_dtype": "auto",
    "enable_prefix_caching": "True",
    "kv_offloading_size": "4",
    "kv_offloading_backend": "native",
    "num_gpu_blocks": "4096",
}
TYPES = {
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:kv_offload_load_bytes": "counter",
    "vllm:kv_offload_load_time": "counter",
    "vllm:kv_offload_store_bytes": "counter",
    "vllm:kv_offload_store_time": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:kv_offload_cpu_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
}
HOST_TYPES = {
    "kvscope:gpu_memory_used_bytes": "gauge",
    "kvscope:gpu_memory_total_bytes": "gauge",
    "kvscope:gpu_utilization_ratio": "gauge",
    "kvscope:gpu_pcie_rx_bytes_per_second": "gauge",
    "kvscope:gpu_pcie_tx_bytes_per_second": "gauge",
    "kvscope:gpu_pcie_link_gen": "gauge",
    "kvscope:gpu_pcie_link_width": "gauge",
    "kvscope:gpu_count": "gauge",
    "kvscope:host_memory_total_bytes": "gauge",
    "kvscope:host_memory_available_bytes": "gauge",
    "kvscope:pinned_offload_file_bytes": "gauge",
    "kvscope:pinned_offload_resident_bytes": "gauge",
    "kvscope:pinned_vllm_rss_shmem_bytes": "gauge",
}


class Engine:
    """Cumulative state of a fake vLLM engine; reset() is a restart."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.reset()

    def reset(self) -> None:
        self.c: dict[str, float] = {}
        # observations per bucket (not cumulative): samples() sums them into Prometheus' le buckets
        self.ttft = [0.0] * len(TTFT_LE)
        self.itl = [0.0] * len(ITL_LE)
        self.ttft_sum = self.itl_sum = 0.0

    def add(self, key: str, v: float) -> None:
        self.c[key] = self.c.get(key, 0.0) + v

    def step(self, dt: float) -> None:
        r = self.rng
        reqs = max(1, int(dt * r.uniform(0.5, 3.0)))
        for _ in range(reqs):
            prompt = r.randint(200, 4000)
            gpu_hit = int(prompt * r.choice([0.0, 0.3, 0.8]))
            external = int((prompt - gpu_hit) * r.choice([0.0, 0.0, 0.5, 0.9]))
            compute = prompt - gpu_hit - external
            self.add("local_cache_hit", gpu_hit)
            self.add("external_kv_transfer", external)
            self.add("local_compute", compute)
            self.add("prompt", prompt)
            self.add("q", prompt)
            self.add("h", gpu_hit)
            self.add("eq", prompt - gpu_hit)
            self.add("eh", external)
            self.add("load_b", external * BYTES_PER_TOKEN)
            self.add("load_t", external * BYTES_PER_TOKEN / 12.6e9)
            stored = r.choice([0, compute, compute * 2])
            self.add("store_b", stored * BYTES_PER_TOKEN)
            self.add("store_t", stored * BYTES_PER_TOKEN / 10e9)
            self.add("prefill_s", compute / 23_000.0 + 0.002)
            ttft = 0.01 + compute / 23_000.0 + external / 110_000.0 + r.expovariate(30)
            self.ttft[bisect_left(TTFT_BOUNDS, ttft)] += 1
            self.ttft_sum += ttft
            for _ in range(r.randint(5, 40)):
                itl = r.uniform(0.012, 0.09) if r.random() > 0.05 else r.uniform(0.1, 0.45)
                self.itl[bisect_left(ITL_BOUNDS, itl)] += 1
                self.itl_sum += itl
        if r.random() < 0.1:
            self.add("preempt", r.randint(1, 3))

    @staticmethod
    def _cumulative(counts: list[float]) -> list[float]:
        out, total = [], 0.0
        for n in counts:
            total += n
            out.append(total)
        return out

    def samples(self) -> list[dict[str, Any]]:
        c = self.c.get
        ttft, itl = self._cumulative(self.ttft), self._cumulative(self.itl)
        out: list[tuple[str, dict[str, str], float]] = [
            ("vllm:cache_config_info", CACHE_CONFIG, 1.0),
            ("vllm:prompt_tokens_total", ID, c("prompt", 0.0)),
            ("vllm:prompt_tokens_cached_total", ID, c("local_cache_hit", 0.0) + c("external_kv_transfer", 0.0)),
            ("vllm:prefix_cache_queries_total", ID, c("q", 0.0)),
            ("vllm:prefix_cache_hits_total", ID, c("h", 0.0)),
            ("vllm:external_prefix_cache_queries_total", ID, c("eq", 0.0)),
            ("vllm:external_prefix_cache_hits_total", ID, c("eh", 0.0)),
            ("vllm:kv_offload_load_bytes_total", ID, c("load_b", 0.0)),
            ("vllm:kv_offload_load_time_total", ID, c("load_t", 0.0)),
            ("vllm:kv_offload_store_bytes_total", ID, c("store_b", 0.0)),
            ("vllm:kv_offload_store_time_total", ID, c("store_t", 0.0)),
            ("vllm:request_prefill_time_seconds_sum", ID, c("prefill_s", 0.0)),
            ("vllm:num_preemptions_total", ID, c("preempt", 0.0)),
            ("vllm:num_requests_running", ID, float(self.rng.randint(0, 8))),
            ("vllm:num_requests_waiting", ID, float(self.rng.randint(0, 3))),
            ("vllm:kv_cache_usage_perc", ID, self.rng.uniform(0.2, 0.95)),
            ("vllm:kv_offload_cpu_cache_usage_perc", ID, self.rng.uniform(0.0, 0.05)),
            ("vllm:time_to_first_token_seconds_sum", ID, self.ttft_sum),
            ("vllm:time_to_first_token_seconds_count", ID, ttft[-1]),
            ("vllm:inter_token_latency_seconds_sum", ID, self.itl_sum),
            ("vllm:inter_token_latency_seconds_count", ID, itl[-1]),
        ]
        for src in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            out.append(("vllm:prompt_tokens_by_source_total", {**ID, "source": src}, c(src, 0.0)))
        for le, n in zip(TTFT_LE, ttft, strict=True):
            out.append(("vllm:time_to_first_token_seconds_bucket", {**ID, "le": le}, n))
        for le, n in zip(ITL_LE, itl, strict=True):
            out.append(("vllm:inter_token_latency_seconds_bucket", {**ID, "le": le}, n))
        return [{"name": n, "labels": dict(lab), "value": float(v)} for n, lab, v in out]


def host_samples(rng: random.Random) -> list[dict[str, Any]]:
    gpu = {"gpu": "0", "name": "NVIDIA H200"}
    out: list[tuple[str, dict[str, str], float]] = [
        ("kvscope:gpu_count", {}, 1.0),
        ("kvscope:gpu_memory_total_bytes", gpu, 141e9),
        ("kvscope:gpu_memory_used_bytes", gpu, rng.uniform(120e9, 130e9)),
        ("kvscope:gpu_utilization_ratio", gpu, rng.uniform(0.3, 0.99)),
        ("kvscope:gpu_pcie_rx_bytes_per_second", gpu, rng.uniform(0.5e9, 9e9)),
        ("kvscope:gpu_pcie_tx_bytes_per_second", gpu, rng.uniform(0.5e9, 7e9)),
        ("kvscope:gpu_pcie_link_gen", {**gpu, "kind": "max"}, 5.0),
        ("kvscope:gpu_pcie_link_width", {**gpu, "kind": "max"}, 16.0),
        ("kvscope:gpu_pcie_link_gen", {**gpu, "kind": "current"}, 5.0),
        ("kvscope:gpu_pcie_link_width", {**gpu, "kind": "current"}, 16.0),
        ("kvscope:host_memory_total_bytes", {}, 256 * 2**30),
        ("kvscope:host_memory_available_bytes", {}, rng.uniform(150, 170) * 2**30),
        ("kvscope:pinned_offload_file_bytes", {"file": "/dev/shm/vllm_offload_0.mmap"}, 4 * 2**30),
        ("kvscope:pinned_offload_resident_bytes", {"file": "/dev/shm/vllm_offload_0.mmap"}, rng.uniform(1, 4) * 2**30),
        ("kvscope:pinned_vllm_rss_shmem_bytes", {"pid": "4242"}, rng.uniform(1, 4) * 2**30),
    ]
    return [{"name": n, "labels": dict(lab), "value": float(v)} for n, lab, v in out]


def recorded_batches(
    t0: float,
    n: int,
    *,
    interval: float = 5.0,
    reset_at: int | None = None,
    seed: int = 7,
    instance: str = "http://127.0.0.1:8000",
    host: str = "rig1",
    agent_id: str = "agent-rec",
    simulated: bool = False,
    seq0: int = 1,
) -> list[dict[str, Any]]:
    """n batches, one scrape each, about `interval` apart (jittered); counters restart at reset_at."""
    rng = random.Random(seed)
    eng = Engine(rng)
    out = []
    t = t0
    for i in range(n):
        dt = interval * rng.uniform(0.8, 1.2)
        t += dt
        if reset_at is not None and i == reset_at:
            eng.reset()
        eng.step(dt)
        out.append(
            {
                "agent_id": agent_id,
                "host": host,
                "seq": seq0 + i,
                "sent_at": t,
                "scrapes": [
                    {
                        "instance": instance,
                        "ts": t,
                        "ok": True,
                        "healthy": True,
                        "model": "qwen3-8b",
                        "version": "0.33.0",
                        "simulated": simulated,
                        "types": dict(TYPES),
                        "samples": eng.samples(),
                    }
                ],
                "host_ts": t,
                "host_samples": host_samples(rng),
                "host_types": dict(HOST_TYPES),
            }
        )
    return out


def push_all(client: Any, token: str, batches: list[dict[str, Any]], clock: Any = None) -> None:
    """POST every batch to the real ingest API; with a FakeClock, the app's time follows the batches."""
    for b in batches:
        if clock is not None:
            clock.t = b["sent_at"] + 0.2
        r = client.post("/api/v1/ingest", json=b, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text


@contextmanager
def opened_app(
    data_dir: Path, clock: Any, *, database_url: str | None = None, allowed_hosts: list[str] | None = None
) -> Iterator[tuple[Any, Any]]:
    """A real app on the database in data_dir (or at database_url), opened as `kvscope serve`
    opens it, with an admin client (API token). Yields (app, client); the engine is disposed after."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings
    from app.storage.engine import open_database

    settings = load_settings(
        None, data_dir=str(data_dir), run_scheduler=False, database_url=database_url, allowed_hosts=allowed_hosts
    )
    engine = open_database(settings.effective_database_url)
    try:
        app = create_app(settings, engine=engine, clock=clock, start_jobs=False)
        with TestClient(app) as client:
            client.headers["Authorization"] = "Bearer " + api_token(engine)
            yield app, client
    finally:
        engine.dispose()


@contextmanager
def fed_app(
    data_dir: Path, batches: list[dict[str, Any]], t0: float, database_url: str | None = None
) -> Iterator[tuple[Any, Any, Any]]:
    """A real app on its own SQLite file (or on database_url) with `batches` pushed through the
    ingest API: for module-scoped fixtures, so a test module pays for the pushing once, and for the
    session's fed databases (tests/fed_databases.py). Yields (app, client, clock)."""
    from app.storage.tokens import create_token
    from tests.conftest import FakeClock

    clock = FakeClock(t0)
    with opened_app(data_dir, clock, database_url=database_url) as (app, client):
        token = create_token(app.state.ctx.engine, "fed", clock(), host="rig1")
        push_all(client, token, batches, clock)
        clock.t = batches[-1]["sent_at"] + 3
        yield app, client, clock
