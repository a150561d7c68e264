"""Simulator personalities: the same simulated run, exposed as SGLang's and TensorRT-LLM's
families, is read back by the agent's engine readers with the same token counts per source."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest

from agent.engines import KEEP_PREFIXES as ENGINE_KEEP
from agent.engines import read_engines
from kvcore.exposition import parse
from kvcore.normalise import KEEP_PREFIXES, normalise
from simulator.metrics import build_registry
from simulator.personalities import personality_registry
from tests.simulator.simdrive import doc_ids, engine, run

BY_SOURCE = "vllm:prompt_tokens_by_source_total"
ARGS = (
    "--profile",
    "laptop8gb-qwen3-reranker-0.6b",
    "--kv-cache-memory-bytes",
    "268435456",
    "--max-model-len",
    "2048",
    "--kv-offloading-size",
    "0.5",
)


def by_source(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, labels, value in samples:
        if name == BY_SOURCE:
            out[labels["source"]] = out.get(labels["source"], 0.0) + value
    return out


def simulated_run() -> object:
    e = engine(*ARGS)
    run(e, doc_ids(99, 10), 1)  # warm-up
    for doc in (1, 2, 3, 1, 1):  # 1 is evicted from the GPU pool by 2 and 3, then reloaded from CPU
        run(e, doc_ids(doc, 1500), 4)
    return e


@pytest.mark.parametrize("personality", ["sglang", "trtllm"])
def test_a_personality_is_detected_as_its_engine_and_counts_the_same_tokens_per_source(personality: str) -> None:
    e = simulated_run()
    reg = build_registry(e)  # type: ignore[arg-type]
    vllm_text = generate_latest(reg).decode()
    own = by_source(normalise(parse(vllm_text, KEEP_PREFIXES)).samples)
    assert own["external_kv_transfer"] > 0 and own["local_cache_hit"] > 0  # the run did reload from CPU

    text = generate_latest(personality_registry(reg, personality)).decode()
    exp = parse(text, KEEP_PREFIXES + ENGINE_KEEP)
    assert exp.bad_lines == 0 and not any(n.startswith("vllm:") for n, _l, _v in exp.samples)
    reading = read_engines(normalise(exp).samples, exp.types.keys())
    assert reading.detection.engine == personality
    got = by_source(reading.samples)
    assert got == pytest.approx(own)
    assert any(n == "vllm:kv_offload_load_bytes_total" for n, _l, _v in reading.samples)


def test_an_unknown_personality_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown simulator engine"):
        personality_registry(build_registry(engine(*ARGS)), "tgi")


def test_the_simulated_server_serves_sglangs_families_at_metrics_when_asked() -> None:
    import asyncio

    from tests.simulator.simdrive import app, client

    async def go() -> str:
        a = app(*ARGS, personality="sglang")
        try:
            async with client(a) as c:
                model = (await c.get("/v1/models")).json()["data"][0]["id"]
                body = {"model": model, "prompt": "hello " * 50, "max_tokens": 2}
                r = await c.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return (await c.get("/metrics")).text
        finally:
            await a.stop()

    text = asyncio.run(go())
    assert "sglang:prefill_effective_tokens_total" in text and "vllm:" not in text
    assert read_engines(normalise(parse(text, KEEP_PREFIXES + ENGINE_KEEP)).samples).detection.engine == "sglang"


def test_sim_engine_is_a_flag_of_kvscope_sim() -> None:
    from simulator.config import make_parser

    assert make_parser().parse_args(["--sim-engine", "trtllm"]).sim_engine == "trtllm"
    with pytest.raises(SystemExit):
        make_parser().parse_args(["--sim-engine", "tgi"])


def test_a_trtllm_personality_serves_json_at_metrics_and_text_at_prometheus_metrics_like_trtllm_serve() -> None:
    import asyncio

    import httpx

    from agent.vllm_reader import VllmReader
    from tests.simulator.simdrive import app, client

    async def go() -> tuple[object, str]:
        a = app(*ARGS, personality="trtllm")
        try:
            async with client(a) as c:
                stats = (await c.get("/metrics")).json()
                text = (await c.get("/prometheus/metrics")).text
                return stats, text
        finally:
            await a.stop()

    stats, text = asyncio.run(go())
    assert isinstance(stats, list) and stats[0]["kvCacheStats"]["tokensPerBlock"] > 0
    assert "trtllm_kv_cache_max_blocks" in text

    routes = {"/metrics": (200, json.dumps(stats)), "/prometheus/metrics": (200, text), "/health": (200, "")}

    def handler(req: httpx.Request) -> httpx.Response:
        status, body = routes.get(req.url.path, (404, ""))
        return httpx.Response(status, text=body)

    reader = VllmReader("http://trt:8000", httpx.Client(transport=httpx.MockTransport(handler)))
    s, _ = reader.scrape(1.0)
    assert reader.metrics_path == "/prometheus/metrics" and reader.detection is not None
    assert reader.detection.engine == "trtllm" and any(x.labels.get("kv_engine") == "trtllm" for x in s.samples)
