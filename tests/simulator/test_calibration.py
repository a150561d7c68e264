"""The field probes (DOMAIN.md), sent through the HTTP API the way the field measured them.

Assertions are on the MODEL's timings (the `x-kvscope-sim-*` headers: exact, wall-clock free) and on
the /metrics counters; each within +-15% of the field figure. The app runs 1000x faster than the
wall clock so the suite stays fast; `bench/calibration.py` repeats the probes in real time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.simulator.simdrive import app, client, doc_text

TOL = 0.15


def near(measured: float, field: float) -> bool:
    return abs(measured / field - 1.0) <= TOL


async def whole_ms(c: httpx.AsyncClient, prompt: str) -> float:
    """Field method for the 4070 probes: the whole non-streaming request, max_tokens=16, temperature 0."""
    r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200, r.text
    return float(r.headers["x-kvscope-sim-e2e-ms"])


async def stream_ttft_ms(c: httpx.AsyncClient, prompt: str) -> float:
    """Field method for the laptop probes: time to first token of a streaming request."""
    async with c.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 4, "stream": True}) as r:
        assert r.status_code == 200
        ttft = float(r.headers["x-kvscope-sim-ttft-ms"])
        async for _ in r.aiter_lines():
            pass
    return ttft


async def counter(c: httpx.AsyncClient, name: str, **labels: str) -> float:
    text = (await c.get("/metrics")).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"{name} {labels} not in /metrics")


def probe(argv: list[str], body: Any) -> Any:
    async def go() -> Any:
        a = app(*argv)
        try:
            async with client(a) as c:
                await c.post("/v1/completions", json={"prompt": "warm up", "max_tokens": 1})
                return await body(c)
        finally:
            await a.stop()

    return asyncio.run(go())


def test_dense_4070_cold_hit_and_reload_from_cpu() -> None:
    prefix = doc_text(0, 2890)

    async def body(c: httpx.AsyncClient) -> dict[str, float]:
        out = {"cold": await whole_ms(c, prefix), "hit": await whole_ms(c, prefix)}
        for i in range(1, 17):  # 16 other ~2,900-token documents evict the prefix from the GPU
            await whole_ms(c, doc_text(i, 2890))
        before = await counter(c, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
        out["reload"] = await whole_ms(c, prefix)
        out["reloaded_tokens"] = (
            await counter(c, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") - before
        )
        out["load_bytes"] = await counter(c, "vllm:kv_offload_load_bytes_total")
        return out

    m = probe(["--profile", "rtx4070-qwen3-4b", "--kv-offloading-size", "8"], body)
    assert near(m["cold"], 602), m
    assert near(m["hit"], 230), m
    assert near(m["reload"], 254), m
    assert m["reloaded_tokens"] == 2880  # the prefix, rounded down to whole 16-token blocks
    assert m["load_bytes"] == 2880 * 36 * 8 * 128 * 2 * 2  # bytes/token = layers x kv_heads x head_dim x 2 x 2


def test_dense_4070_without_offload_recomputes_after_eviction() -> None:
    prefix = doc_text(0, 2890)

    async def body(c: httpx.AsyncClient) -> float:
        await whole_ms(c, prefix)
        for i in range(1, 17):
            await whole_ms(c, doc_text(i, 2890))
        return await whole_ms(c, prefix)

    assert near(probe(["--profile", "rtx4070-qwen3-4b"], body), 602)


def test_hybrid_4070_cold_and_gpu_hit() -> None:
    prefix = doc_text(0, 2500)

    async def body(c: httpx.AsyncClient) -> tuple[float, float, float]:
        cold, hit = await whole_ms(c, prefix), await whole_ms(c, prefix)
        return cold, hit, await counter(c, "vllm:prefix_cache_hits_total")

    cold, hit, hits = probe(["--profile", "rtx4070-qwen3.5-4b"], body)
    assert near(cold, 2646), cold
    assert near(hit, 83), hit
    assert hits == 3 * 832  # hybrid models hit only at their large attention block size


LAPTOP = [
    "--profile",
    "laptop8gb-qwen3-reranker-0.6b",
    "--kv-cache-memory-bytes",
    "268435456",
    "--max-model-len",
    "2048",
]


def test_laptop_reranker_streaming_ttft_with_offload() -> None:
    a_doc, b_doc, c_doc = doc_text(0, 1600), doc_text(1, 1500), doc_text(2, 1500)

    async def body(c: httpx.AsyncClient) -> dict[str, float]:
        out = {"cold": await stream_ttft_ms(c, a_doc), "hit": await stream_ttft_ms(c, a_doc)}
        await stream_ttft_ms(c, b_doc)
        await stream_ttft_ms(c, c_doc)
        out["reload"] = await stream_ttft_ms(c, a_doc)
        out["ext"] = await counter(c, "vllm:external_prefix_cache_hits_total")
        return out

    m = probe([*LAPTOP, "--kv-offloading-size", "0.5"], body)
    assert near(m["cold"], 77), m
    assert near(m["hit"], 14.0), m
    assert near(m["reload"], 35), m
    assert m["ext"] == 1584


def test_laptop_reranker_without_offload_and_first_request_warmup() -> None:
    a_doc = doc_text(0, 1600)

    async def go() -> tuple[float, float]:
        a = app(*LAPTOP)
        try:
            async with client(a) as c:
                first = await stream_ttft_ms(c, a_doc)  # first request of a fresh server
                await stream_ttft_ms(c, doc_text(1, 1500))
                await stream_ttft_ms(c, doc_text(2, 1500))
                return first, await stream_ttft_ms(c, a_doc)
        finally:
            await a.stop()

    first, after = asyncio.run(go())
    assert near(first, 104), first
    assert near(after, 77), after
