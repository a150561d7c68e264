"""The HTTP surface: endpoints, OpenAI shapes and errors, streaming, dev-mode reset, the simulated marker,
and /metrics against vLLM's real exposition (tests/fixtures/vllm) and metric catalog."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.server import SimApp
from tests.simulator.simdrive import app, client, doc_text
from tests.waits import wait_until_async

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
OFFLOAD = ["--profile", "tiny", "--kv-offloading-size", "0.05"]


def with_client(argv: list[str], body: Callable[[httpx.AsyncClient], Awaitable[Any]], **kw: Any) -> Any:
    async def go() -> Any:
        a: SimApp = app(*argv, **kw)
        try:
            async with client(a) as c:
                return await body(c)
        finally:
            await a.stop()

    return asyncio.run(go())


def test_info_endpoints_and_marker() -> None:
    async def body(c: httpx.AsyncClient) -> None:
        h = await c.get("/health")
        assert h.status_code == 200 and h.content == b"" and h.headers["x-kvscope-simulated"] == "1"
        v = (await c.get("/version")).json()
        assert v["kvscope_simulated"] is True and v["version"].count(".") == 2
        [m] = (await c.get("/v1/models")).json()["data"]
        assert (m["id"], m["root"], m["max_model_len"]) == ("tiny-sim", "Qwen/Qwen3-0.6B", 4096)
        nf = await c.get("/nope")
        assert nf.status_code == 404 and nf.headers["x-kvscope-simulated"] == "1"
        assert (await c.get("/v1/completions")).status_code == 405

    with_client(["--profile", "tiny", "--served-model-name", "tiny-sim", "--max-model-len", "4096"], body)


def test_completion_and_chat_shapes_and_token_counts() -> None:
    async def body(c: httpx.AsyncClient) -> None:
        r = await c.post(
            "/v1/completions", json={"model": "Qwen/Qwen3-0.6B", "prompt": doc_text(0, 50), "max_tokens": 5}
        )
        j = r.json()
        assert r.status_code == 200 and j["object"] == "text_completion"
        assert j["usage"] == {
            "prompt_tokens": 50,
            "completion_tokens": 5,
            "total_tokens": 55,
            "prompt_tokens_details": None,
        }
        assert j["choices"][0]["finish_reason"] == "length" and len(j["choices"][0]["text"].split()) == 5
        r = await c.post("/v1/completions", json={"prompt": list(range(40)), "max_tokens": 2})
        assert r.json()["usage"]["prompt_tokens"] == 40
        r = await c.post(
            "/v1/chat/completions",
            json={
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "hi there"}]},
                ],
                "max_tokens": 3,
            },
        )
        j = r.json()
        assert j["object"] == "chat.completion" and j["choices"][0]["message"]["role"] == "assistant"
        assert j["usage"]["prompt_tokens"] == (3 + 2) + (3 + 2) + 2  # per message: 3 template tokens + words
        same = await c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "seed": 1}
        )
        again = await c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
        )
        assert same.json()["choices"][0]["message"]["content"] == again.json()["choices"][0]["message"]["content"]

    with_client(["--profile", "tiny"], body)


def test_streaming_chat_and_completion() -> None:
    async def body(c: httpx.AsyncClient) -> None:
        async with c.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            assert float(r.headers["x-kvscope-sim-ttft-ms"]) > 0
            lines = [ln async for ln in r.aiter_lines() if ln]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert [ch["choices"][0]["finish_reason"] for ch in chunks[1:4]] == [None, None, "length"]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
        async with c.stream("POST", "/v1/completions", json={"prompt": "a b c", "max_tokens": 2, "stream": True}) as r:
            lines = [ln async for ln in r.aiter_lines() if ln]
        assert len(lines) == 3 and json.loads(lines[0][6:])["object"] == "text_completion"

    with_client(["--profile", "tiny"], body)


@pytest.mark.parametrize(
    ("payload", "status", "err_type", "fragment"),
    [
        (b"{not json", 400, "BadRequestError", "JSON decode error"),
        (b"[1, 2]", 400, "BadRequestError", "valid dictionary"),
        (
            json.dumps({"prompt": "x", "max_tokens": -1}).encode(),
            400,
            "BadRequestError",
            "max_tokens must be at least 1, got -1.",
        ),
        (json.dumps({"prompt": "x", "max_tokens": "many"}).encode(), 400, "BadRequestError", "valid integer"),
        (
            json.dumps({"prompt": doc_text(0, 2100)}).encode(),
            400,
            "BadRequestError",
            "maximum context length is 2048 tokens. However, your request has 2100 input tokens",
        ),
        (
            json.dumps({"prompt": doc_text(0, 2040), "max_tokens": 20}).encode(),
            400,
            "BadRequestError",
            "'max_tokens' or 'max_completion_tokens' is too large: 20",
        ),
        (
            json.dumps({"prompt": "x", "model": "gpt-4"}).encode(),
            404,
            "NotFoundError",
            "The model `gpt-4` does not exist.",
        ),
        (json.dumps({"max_tokens": 2}).encode(), 400, "BadRequestError", "Field required"),
    ],
)
def test_bad_input_gets_vllm_status_and_error_shape(payload: bytes, status: int, err_type: str, fragment: str) -> None:
    async def body(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/v1/completions", content=payload, headers={"content-type": "application/json"})

    r = with_client(["--profile", "tiny", "--max-model-len", "2048"], body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["type"] == err_type and err["code"] == status and fragment in err["message"]
    assert r.headers["x-kvscope-simulated"] == "1"


def test_reset_prefix_cache_only_in_dev_mode() -> None:
    async def body(c: httpx.AsyncClient) -> tuple[int, str]:
        await c.post("/v1/completions", json={"prompt": doc_text(0, 400), "max_tokens": 2})
        r = await c.post("/reset_prefix_cache?reset_external=true")
        again = await c.post("/v1/completions", json={"prompt": doc_text(0, 400), "max_tokens": 2})
        return r.status_code, again.headers["x-kvscope-sim-prompt-tokens-by-source"]

    code, src = with_client(OFFLOAD, body, dev_mode=True)
    assert code == 200 and "local_cache_hit=0," in src and "external_kv_transfer=0" in src

    async def body404(c: httpx.AsyncClient) -> int:
        return (await c.post("/reset_prefix_cache")).status_code

    assert with_client(OFFLOAD, body404, dev_mode=False) == 404


def test_concurrent_http_requests_queue() -> None:
    async def body(c: httpx.AsyncClient) -> list[float]:
        await c.post("/v1/completions", json={"prompt": "warm", "max_tokens": 1})
        rs = await asyncio.gather(
            *(c.post("/v1/completions", json={"prompt": doc_text(i, 3000), "max_tokens": 1}) for i in range(4))
        )
        return sorted(float(r.headers["x-kvscope-sim-ttft-ms"]) for r in rs)

    # model time at wall-clock speed: the four arrivals, however far apart a loaded machine spreads
    # them (up to ~0.4 s), still overlap (a faster model clock magnifies that spread)
    ttfts = with_client(["--profile", "rtx4070-qwen3-4b"], body, time_scale=1.0)
    alone = 26.0 + 3000 / 7742 * 1000
    assert ttfts[-1] > 3 * alone  # four prefills shared the device


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _scrape(argv: list[str], traffic: bool = True) -> dict[str, Any]:
    async def body(c: httpx.AsyncClient) -> str:
        if traffic:
            for i in (0, 1, 0):
                await c.post("/v1/completions", json={"prompt": doc_text(i, 300), "max_tokens": 3})
        r = await c.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain; version=1.0.0")
        return r.text

    return _families(with_client(argv, body))


def test_metrics_names_types_labels_and_buckets_match_vllm() -> None:
    fams = _scrape(OFFLOAD)
    catalog = {m["name"]: m for m in json.loads((FIX / "metric_catalog.json").read_text())["metrics"]}
    real = _families((FIX / "real__vllm-0.32.0-cpu__tiny-llama__prefix-cache.prom").read_text())
    vllm = {n: f for n, f in fams.items() if n.startswith("vllm:")}
    assert "vllm:prompt_tokens_by_source" in vllm and "vllm:kv_offload_load_bytes" in vllm
    for name, fam in vllm.items():
        if name.endswith("_created"):
            assert fam.type == "gauge" and name.removesuffix("_created") in vllm, name
            continue
        ref = catalog.get(name) or catalog.get(name.removesuffix("_total"))
        real_fam = real.get(name)
        if ref is None and real_fam is None:
            assert name == "vllm:kv_offload_config_info", name  # newest builds only; not in the catalog
            continue
        if ref is not None:
            assert fam.type == ref["type"], name
            if isinstance(ref.get("buckets"), list) and fam.samples:
                les = sorted({float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")})
                assert les[:-1] == [float(b) for b in ref["buckets"]], name
        if real_fam is not None:
            assert fam.type == real_fam.type, name
            want = {k for s in real_fam.samples for k in s.labels}
            got = {k for s in fam.samples for k in s.labels}
            if name != "vllm:cache_config_info":
                assert got == want, name
    # the deprecated offload names ride alongside the new ones, as current vLLM emits them
    assert {"vllm:kv_offload_total_bytes", "vllm:kv_offload_total_time", "vllm:kv_offload_size"} <= set(vllm)
    ccfg = next(s.labels for s in vllm["vllm:cache_config_info"].samples)
    real_ccfg = next(s.labels for s in real["vllm:cache_config_info"].samples)
    assert set(real_ccfg) <= set(ccfg)
    assert ccfg["kv_offloading_size"] == "0.05" and ccfg["num_cpu_blocks"] == "None"
    # buckets that depend on max_model_len follow build_1_2_5_buckets
    les = [s.labels["le"] for s in vllm["vllm:request_prompt_tokens"].samples if s.name.endswith("_bucket")]
    assert les[:4] == ["1.0", "2.0", "5.0", "10.0"] and les[-1] == "+Inf"


def test_metrics_without_offload_have_no_offload_families_but_external_counters() -> None:
    fams = _scrape(["--profile", "tiny"])
    assert not [n for n in fams if n.startswith("vllm:kv_offload")]
    assert "vllm:external_prefix_cache_queries" in fams  # present at 0 without a connector
    ext = [s.value for s in fams["vllm:external_prefix_cache_queries"].samples if s.name.endswith("_total")]
    assert ext == [0.0]


def test_offload_config_info_appears_after_the_first_step() -> None:
    assert "vllm:kv_offload_config_info" not in _scrape(OFFLOAD, traffic=False)
    fams = _scrape(OFFLOAD)
    [s] = fams["vllm:kv_offload_config_info"].samples
    assert int(s.labels["cpu_num_chunks"]) > 0 and s.labels["spec_name"] == "CPUOffloadingSpec"


def test_tiering_families_with_tier_labels(tmp_path: Path) -> None:
    tc = json.dumps(
        {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": 2**26,
                "secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path)}],
            },
        }
    )
    fams = _scrape(["--profile", "tiny", "--kv-transfer-config", tc])
    tiers = {s.labels["tier"] for s in fams["vllm:kv_offload_tiering_block_queries"].samples}
    assert tiers == {"0:primary", "1:fs"}
    writes = [s.value for s in fams["vllm:kv_offload_tiering_write_bytes"].samples if s.name.endswith("_total")]
    assert writes and writes[0] > 0


def test_hybrid_crash_over_http_fails_in_flight_requests_and_calls_fatal() -> None:
    fatal: list[str] = []
    argv = [
        "--profile",
        "rtx4070-qwen3.5-4b",
        "--num-gpu-blocks-override",
        "2",
        "--max-model-len",
        "1600",
        "--kv-offloading-size",
        "0.15",
        "--hybrid-failure",
        "crash",
    ]

    async def body(c: httpx.AsyncClient) -> tuple[int, int, int]:
        for i in (1, 2):
            assert (
                await c.post("/v1/completions", json={"prompt": doc_text(i, 900), "max_tokens": 2})
            ).status_code == 200
        reload = await c.post("/v1/completions", json={"prompt": doc_text(1, 900), "max_tokens": 2})
        after = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        health = await c.get("/health")
        await wait_until_async(lambda: fatal, "the fatal callback (it runs after the 500s went out)")
        return reload.status_code, after.status_code, health.status_code

    assert with_client(argv, body, on_fatal=fatal.append) == (500, 500, 500)
    assert fatal and "restoring the recurrent" in fatal[0]


def test_legacy_metric_names_view_and_load_endpoint() -> None:
    async def body(c: httpx.AsyncClient) -> tuple[str, dict[str, Any]]:
        for i in (0, 0):
            await c.post("/v1/completions", json={"prompt": doc_text(i, 300), "max_tokens": 3})
        load = (await c.get("/load")).json()
        return (await c.get("/metrics")).text, load

    text, load = with_client(OFFLOAD, body, legacy_metric_names=True, load_tracking=True)
    assert load == {"server_load": 0}
    fams = _families(text)
    legacy = json.loads((FIX / "metric_catalog.json").read_text())["metrics"]
    olds = {o.split()[0] for m in legacy for o in m.get("older_names", [])}
    assert {
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_hits_total",
        "vllm:time_per_output_token_seconds",
    } <= olds
    assert {
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_queries",
        "vllm:gpu_prefix_cache_hits",
        "vllm:time_per_output_token_seconds",
        "vllm:kv_offload_total_bytes",
    } <= set(fams)
    assert not {
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries",
        "vllm:prompt_tokens_by_source",
        "vllm:kv_offload_load_bytes",
        "vllm:inter_token_latency_seconds",
    } & set(fams)
    hits = [s.value for s in fams["vllm:gpu_prefix_cache_hits"].samples if s.name.endswith("_total")]
    assert hits == [288.0]


def test_many_concurrent_clients_all_get_answers() -> None:
    """Regression: events produced while a request was being submitted were once dropped, so some
    concurrent requests never got their answer."""
    argv = [
        "--profile",
        "laptop8gb-qwen3-reranker-0.6b",
        "--kv-cache-memory-bytes",
        "268435456",
        "--max-model-len",
        "2048",
        "--kv-offloading-size",
        "0.5",
    ]

    async def body(c: httpx.AsyncClient) -> int:
        sem = asyncio.Semaphore(4)

        async def one(i: int) -> int:
            async with sem:
                prompt = doc_text(i % 4, 600) + " " + " ".join(f"s{i}x{k}" for k in range(8))
                r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "stream": i % 3 == 0})
                return r.status_code

        codes = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(40))), 60)
        return sum(1 for x in codes if x == 200)

    assert with_client(argv, body, time_scale=10.0) == 40


def test_a_simulator_bug_fails_requests_instead_of_hanging(capsys: pytest.CaptureFixture[str]) -> None:
    fatal: list[str] = []

    async def body(c: httpx.AsyncClient) -> int:
        a = c._transport.app  # type: ignore[attr-defined]

        def broken(now: float) -> list[Any]:
            raise RuntimeError("boom")

        a.engine.advance = broken
        r = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        await wait_until_async(lambda: fatal, "the fatal callback of the broken engine")
        return r.status_code

    assert with_client(["--profile", "tiny"], body, on_fatal=fatal.append) == 500
    assert fatal and "boom" in fatal[0]
    assert "RuntimeError: boom" in capsys.readouterr().err
