"""The agent's reader on fake engine endpoints: detection without flags, the override, the
engines' own endpoints (TensorRT-LLM's JSON /metrics, KVBM's metrics-only port)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from agent.vllm_reader import VllmReader

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SGLANG = (FIXTURES / "sglang" / "real__sglang-0.5.23__hicache-collectors-driven.prom").read_text()
TRTLLM = (FIXTURES / "trtllm" / "documented__trtllm-main-2026-collector__host-offload.prom").read_text()
KVBM = (FIXTURES / "dynamo-kvbm" / "documented__kvbm-1.6.1__host-and-disk.prom").read_text()


class Endpoint:
    """A fake server: path -> (status, body); records the paths asked."""

    def __init__(self, routes: dict[str, tuple[int, str]]) -> None:
        self.routes = routes
        self.calls: list[str] = []

    def client(self) -> httpx.Client:
        def handler(req: httpx.Request) -> httpx.Response:
            self.calls.append(req.url.path)
            status, body = self.routes.get(req.url.path, (404, "not found"))
            return httpx.Response(status, text=body)

        return httpx.Client(transport=httpx.MockTransport(handler))


def test_an_sglang_server_is_read_without_a_flag_into_the_dashboards_families() -> None:
    ep = Endpoint(
        {
            "/metrics": (200, SGLANG),
            "/health": (200, ""),
            "/v1/models": (200, json.dumps({"data": [{"id": "tiny", "root": "/m", "max_model_len": 4096}]})),
            "/version": (404, ""),
        }
    )
    reader = VllmReader("http://sgl:30000", ep.client())
    s, _events = reader.scrape(100.0)
    assert s.ok and s.healthy and s.model == "tiny"
    assert reader.detection is not None and reader.detection.engine == "sglang"
    by_source = {x.labels.get("source"): x for x in s.samples if x.name == "vllm:prompt_tokens_by_source_total"}
    assert by_source["external_kv_transfer"].labels["kv_engine"] == "sglang"
    assert s.types["vllm:prompt_tokens_by_source"] == "counter"
    assert any(x.name == "sglang:load_back_bytes_total" for x in s.samples)  # raw families kept too
    [info] = [x for x in s.samples if x.name == "kvscope:kv_engine_info"]
    assert info.labels["engine"] == "SGLang" and info.labels["block_size"] == "64"


def test_a_kvbm_port_is_scraped_for_metrics_only_once_it_is_known() -> None:
    ep = Endpoint({"/metrics": (200, KVBM)})
    reader = VllmReader("http://kvbm:6880", ep.client())
    first, _ = reader.scrape(1.0)
    assert first.ok and reader.detection is not None and reader.detection.engine == "dynamo-kvbm"
    ep.calls.clear()
    second, _ = reader.scrape(2.0)
    assert ep.calls == ["/metrics"]  # no /health, /v1/models, /version on KVBM's port
    assert second.ok and second.healthy is True and second.error is None


def test_the_url_fragment_names_the_engine_and_block_size_from_the_first_scrape() -> None:
    ep = Endpoint({"/metrics": (200, KVBM)})
    reader = VllmReader("http://kvbm:6880#engine=dynamo-kvbm&block_size=16", ep.client())
    s, _ = reader.scrape(1.0)
    assert s.instance == "http://kvbm:6880" and ep.calls == ["/metrics"]
    [load] = [
        x for x in s.samples if x.name == "kvscope:kv_tier_transfer_tokens_total" and x.labels["path"] == "CPU->GPU"
    ]
    assert load.value == 310 * 16 and load.labels["converted"] == "blocks" and load.labels["block_size"] == "16"


def test_a_kvbm_port_that_stops_answering_is_reported_unhealthy() -> None:
    ep = Endpoint({"/metrics": (200, KVBM)})
    reader = VllmReader("http://kvbm:6880#engine=dynamo-kvbm", ep.client())
    reader.scrape(1.0)
    ep.routes["/metrics"] = (500, "boom")
    s, _ = reader.scrape(2.0)
    assert not s.ok and s.healthy is False and "/metrics answered 500" in (s.error or "")


def test_trtllm_serves_json_at_metrics_so_the_prometheus_path_is_found_and_kept() -> None:
    iteration = [{"kvCacheStats": {"maxNumBlocks": 10, "usedNumBlocks": 5, "tokensPerBlock": 32}}]
    ep = Endpoint(
        {
            "/metrics": (200, json.dumps(iteration)),
            "/prometheus/metrics": (200, TRTLLM),
            "/health": (200, ""),
        }
    )
    reader = VllmReader("http://trt:8000", ep.client())
    s, _ = reader.scrape(1.0)
    assert reader.detection is not None and reader.detection.engine == "trtllm"
    assert any(x.name == "vllm:kv_offload_load_bytes_total" and x.labels["kv_engine"] == "trtllm" for x in s.samples)
    ep.calls.clear()
    reader.scrape(2.0)
    assert "/prometheus/metrics" in ep.calls and "/metrics" not in ep.calls


def test_trtllm_json_alone_still_gives_its_kv_block_readings() -> None:
    iteration = [{"kvCacheStats": {"maxNumBlocks": 10, "usedNumBlocks": 5, "tokensPerBlock": 32}}]
    ep = Endpoint({"/metrics": (200, json.dumps(iteration)), "/health": (200, "")})
    s, _ = VllmReader("http://trt:8000", ep.client()).scrape(1.0)
    got = {(x.name, x.labels.get("tier")): x.value for x in s.samples}
    assert got[("kvscope:kv_tier_capacity_tokens", "GPU")] == 320.0
    assert got[("vllm:kv_cache_usage_perc", None)] == 0.5


def test_json_that_is_not_iteration_stats_is_reported_not_crashed_on() -> None:
    ep = Endpoint({"/metrics": (200, "{not json"), "/health": (200, "")})
    s, _ = VllmReader("http://x:1", ep.client()).scrape(1.0)
    assert not s.ok and "JSON that cannot be read" in (s.error or "")
