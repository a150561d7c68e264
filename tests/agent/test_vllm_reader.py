"""The vLLM reader on a fake server: each source fails alone, the scrape says why."""

from __future__ import annotations

import httpx

from agent.vllm_reader import VllmReader
from tests.agent.fakevllm import FakeVllm


def test_ok_scrape_reads_everything_with_plain_accept() -> None:
    fake = FakeVllm()
    r = VllmReader("http://vllm:8000/", fake.client())
    s, ev = r.scrape(1000.0)
    assert s.ok and s.healthy and s.error is None
    assert s.instance == "http://vllm:8000"
    assert (s.model, s.model_root, s.max_model_len, s.version) == ("tiny", "/srv/models/tiny-llama", 2048, "0.33.0")
    assert s.simulated is False
    assert fake.accept == ["text/plain"]
    assert any(x.name == "vllm:prompt_tokens_total" and x.value == fake.prompt_tokens(1) for x in s.samples)
    assert s.types["vllm:prompt_tokens"] == "counter"
    assert ev == []
    # model and version are not re-read every tick
    fake.calls.clear()
    r.scrape(1001.0)
    assert sorted(fake.calls) == ["/health", "/metrics"]


def test_simulated_header_marks_the_scrape() -> None:
    fake = FakeVllm(simulated=True)
    s, _ = VllmReader("http://sim:8000", fake.client()).scrape(1000.0)
    assert s.simulated is True


def test_simulated_from_version_json() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/version":
            return httpx.Response(200, json={"version": "0.33.0", "kvscope_simulated": True})
        return httpx.Response(200, text="vllm:num_requests_running 1\n")

    s, _ = VllmReader("http://sim", httpx.Client(transport=httpx.MockTransport(handler))).scrape(1.0)
    assert s.simulated and s.ok


def test_500_everywhere() -> None:
    fake = FakeVllm()
    fake.mode = "500"
    s, _ = VllmReader("http://vllm", fake.client()).scrape(1000.0)
    assert not s.ok and s.healthy is False
    assert "/metrics answered 500" in (s.error or "")
    assert s.samples == []


def test_timeouts_on_every_call() -> None:
    fake = FakeVllm()
    fake.mode = "timeout"
    s, _ = VllmReader("http://vllm", fake.client()).scrape(1000.0)
    assert not s.ok and s.healthy is False
    assert "/health: timed out" in (s.error or "") and "not asked (server unreachable)" in (s.error or "")
    assert fake.calls == ["/health"]  # one timeout per tick, not one per endpoint


def test_metrics_timeout_alone() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/metrics":
            raise httpx.ReadTimeout("slow", request=req)
        return httpx.Response(200, json={"version": "1", "data": [{"id": "m"}]})

    s, _ = VllmReader("http://v", httpx.Client(transport=httpx.MockTransport(handler))).scrape(1.0)
    assert not s.ok and s.healthy and s.model == "m"
    assert s.error == "/metrics: timed out"


def test_garbage_exposition_is_a_failed_scrape_never_a_crash() -> None:
    fake = FakeVllm()
    fake.mode = "garbage"
    s, _ = VllmReader("http://vllm", fake.client()).scrape(1000.0)
    assert s.samples == [] and not s.ok and s.healthy
    assert "no vLLM families" in (s.error or "")


def test_a_bad_line_among_good_ones_is_reported_the_rest_kept() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text='vllm:num_requests_running 1\nvllm:num_requests_waiting{x="1} 2\n')

    s, _ = VllmReader("http://v", httpx.Client(transport=httpx.MockTransport(handler))).scrape(1.0)
    assert s.ok and [x.name for x in s.samples] == ["vllm:num_requests_running"]
    assert "1 unreadable line" in (s.error or "")


def test_metrics_fail_alone_when_models_fails() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/models":
            raise httpx.ReadTimeout("slow", request=req)
        if req.url.path == "/metrics":
            return httpx.Response(200, text='vllm:num_requests_running{engine="0"} 2\n')
        return httpx.Response(200, json={"version": "1"})

    s, _ = VllmReader("http://v", httpx.Client(transport=httpx.MockTransport(handler))).scrape(1.0)
    assert s.ok and s.healthy
    assert s.samples[0].value == 2
    assert "/v1/models: timed out" in (s.error or "")


def test_nan_values_dropped_and_reported() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running 1\n")

    s, ev = VllmReader("http://v", httpx.Client(transport=httpx.MockTransport(handler))).scrape(1.0)
    assert [x.name for x in s.samples] == ["vllm:num_requests_running"]
    assert [e.kind for e in ev] == ["values_dropped"]
