"""Workload pieces without a server: the spec, one request's timing and failures (fake server over
httpx.MockTransport), counter snapshots on every captured /metrics file, deltas, histogram
quantiles, and the replay / observe / prefix-repetition drivers on a fake clock."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.workloads import prompts
from agent.workloads.completions import send_completion
from agent.workloads.context import RunContext
from agent.workloads.prefix_repetition import prefix_sequence
from agent.workloads.runner import execute_run, reset_caches, server_info
from agent.workloads.snapshot import (
    Snapshot,
    configured_offload_bytes,
    delta,
    parse_snapshot,
)
from agent.workloads.spec import WorkloadSpec, parse_workload
from kvcore.series import histogram_quantile
from tests.paths import FIXTURES

FIXTURES = FIXTURES / "vllm"


# ---------------------------------------------------------------- spec
@pytest.mark.parametrize(
    ("data", "msg"),
    [
        ({"kind": "nope"}, "workload kind must be one of"),
        ({"repetitions": 0}, "repetitions must be between"),
        ({"prefix_tokens": "many"}, "prefix_tokens must be a whole number"),
        ({"prefix_tokens": 2.5}, "whole number"),
        ({"max_tokens": True}, "whole number"),
        ({"zipf_s": float("nan")}, "zipf_s must be between"),
        ({"stream": "yes"}, "stream must be true or false"),
        ({"distribution": "pareto"}, "distribution must be one of"),
        ({"colour": 1}, "unknown workload field(s): colour"),
        ({"kind": "replay"}, "needs trace_path"),
        ({"kind": "replay", "records": [{"prompt": ""}]}, 'non-empty "prompt"'),
        ({"kind": "replay", "records": [{"prompt": "x", "offset_s": -1}]}, "offset_s must be between"),
        ({"kind": "replay", "records": "x"}, "non-empty list"),
    ],
)
def test_spec_refuses_bad_input_with_one_line(data: dict[str, Any], msg: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_workload(data)
    assert msg in str(exc.value)
    assert "\n" not in str(exc.value)


def test_spec_defaults_trace_file_and_roundtrip(tmp_path: Path) -> None:
    s = parse_workload(None)
    assert s.kind == "probe" and s.prefix_tokens == 1500 and s.evict_prefixes is None
    assert "probe: 1500-token prefix, auto (sized from the GPU pool and offload tiers) evicting" in s.describe()
    assert parse_workload({"evict_prefixes": "auto"}).evict_prefixes is None
    assert parse_workload({"evict_prefixes": 3}).evict_prefixes == 3
    from agent.workloads.probe import evict_count
    from agent.workloads.runner import pool_tokens

    assert evict_count(2336, 1500) == 2 and evict_count(40432, 2900) == 14 and evict_count(None, 100) == 2
    assert pool_tokens({"kv_cache_size_tokens": "2336"}) == 2336
    assert pool_tokens({"kv_cache_size_tokens": "None", "num_gpu_blocks": "146", "block_size": "16"}) == 2336
    assert pool_tokens({"num_gpu_blocks": "x"}) is None and pool_tokens({}) is None
    assert parse_workload(s.to_dict()) == s
    (tmp_path / "t.jsonl").write_text('{"prompt": "a b c", "max_tokens": 4}\nnot json\n')
    with pytest.raises(ValueError, match="line 2: not JSON"):
        parse_workload({"kind": "replay", "trace_path": "t.jsonl"}, base_dir=tmp_path)
    (tmp_path / "t.jsonl").write_text('{"prompt": "a b c", "max_tokens": 4}\n')
    r = parse_workload({"kind": "replay", "trace_path": "t.jsonl"}, base_dir=tmp_path)
    assert r.records == [{"prompt": "a b c", "max_tokens": 4}] and "replay: 1 recorded" in r.describe()
    for kind in ("prefix-repetition", "observe"):
        assert parse_workload({"kind": kind}).describe().startswith(kind)


def test_prompts_are_deterministic_and_distinct() -> None:
    a = prompts.text("k1", 50)
    assert a == prompts.text("k1", 50) and len(a.split()) == 50 and a.startswith("[k1]")
    assert prompts.text("k2", 50) != a
    assert prefix_sequence(10, 3, "round-robin", 1.0, "s") == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    z = prefix_sequence(500, 5, "zipf", 1.2, "s")
    assert z == prefix_sequence(500, 5, "zipf", 1.2, "s") and z.count(0) > z.count(4)
    assert set(prefix_sequence(200, 4, "uniform", 1.0, "s")) == {0, 1, 2, 3}


# ---------------------------------------------------------------- one request
class Ticker:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.01
        return self.t


def _sse(*chunks: Any) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n" for c in chunks)


def _client(handler: Any) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def test_streaming_request_timings_usage_and_modeled_ttft() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        body = json.loads(req.content)
        assert body["stream"] and body["model"] == "m" and body["temperature"] == 0
        return httpx.Response(
            200,
            headers={"x-kvscope-sim-ttft-ms": "35.5", "x-other": "1"},
            content=_sse(
                {"choices": [{"text": ""}]},
                {"choices": [{"text": "a"}]},
                {"choices": [{"text": "b"}]},
                {"choices": [{"text": "c"}]},
                {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3}},
                b"[DONE]",
            ),
        )

    res = send_completion(
        _client(handler),
        "http://x",
        model="m",
        prompt="p",
        max_tokens=3,
        stream=True,
        timeout_s=5,
        tag="cold",
        clock=Ticker(),
    )
    assert res.ok and res.tag == "cold" and res.status == 200
    assert res.ttft_s == pytest.approx(0.01) and res.itl_s == pytest.approx(0.01)
    assert (res.prompt_tokens, res.output_tokens) == (12, 3)
    assert res.model_ttft_s == pytest.approx(0.0355)
    assert res.server_headers == {"x-kvscope-sim-ttft-ms": "35.5"}


@pytest.mark.parametrize(
    ("handler", "stream", "msg"),
    [
        (
            lambda r: httpx.Response(500, json={"error": {"message": "EngineCore died"}}),
            True,
            "HTTP 500: EngineCore died",
        ),
        (lambda r: httpx.Response(400, json={"message": "too long"}), False, "HTTP 400: too long"),
        (lambda r: httpx.Response(503, text="<html>busy"), False, "HTTP 503: <html>busy"),
        (lambda r: httpx.Response(200, text="not json"), False, "unreadable answer"),
        (lambda r: httpx.Response(200, content=_sse({"error": "boom"})), True, "stream error"),
        (lambda r: httpx.Response(200, content=b""), True, "stream ended without data"),
    ],
)
def test_failed_requests_are_results_not_exceptions(handler: Any, stream: bool, msg: str) -> None:
    res = send_completion(
        _client(handler), "http://x", model=None, prompt="p", max_tokens=3, stream=stream, timeout_s=5, tag="reload"
    )
    assert not res.ok and msg in (res.error or "")
    assert res.model_ttft_s is None


def test_timeout_and_connection_errors() -> None:
    def slow(r: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=r)

    def dead(r: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=r)

    res = send_completion(
        _client(slow), "http://x", model=None, prompt="p", max_tokens=1, stream=True, timeout_s=2, tag="reload"
    )
    assert not res.ok and "no answer within 2 s (timeout)" in (res.error or "")
    res = send_completion(
        _client(dead), "http://x", model=None, prompt="p", max_tokens=1, stream=False, timeout_s=2, tag="reload"
    )
    assert not res.ok and "ConnectError" in (res.error or "")


def test_non_streaming_ttft_is_the_whole_request() -> None:
    def handler(r: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"choices": [{"text": "x"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
        )

    res = send_completion(
        _client(handler),
        "http://x",
        model=None,
        prompt="p",
        max_tokens=1,
        stream=False,
        timeout_s=2,
        tag="hit",
        clock=Ticker(),
    )
    assert res.ok and res.ttft_s == res.e2e_s and res.itl_s is None and res.output_tokens == 1


# ---------------------------------------------------------------- snapshots
@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.prom")), ids=lambda p: p.name)
def test_snapshot_reads_every_captured_exposition(path: Path) -> None:
    snap = parse_snapshot(path.read_text())
    assert snap.counters["vllm:prompt_tokens_total"] > 0
    assert "vllm:time_to_first_token_seconds" in snap.buckets
    assert snap.cache_config.get("block_size")
    by_source = sum(snap.by_source.values())
    if by_source:
        assert by_source == pytest.approx(snap.counters["vllm:prompt_tokens_total"])
    d = delta(Snapshot(), snap, 10.0)
    assert d["valid"] and d["prompt_tokens"] == snap.counters["vllm:prompt_tokens_total"]
    if d["share_by_source"]:
        assert sum(d["share_by_source"].values()) == pytest.approx(1.0)
    ttft = d["server"]["ttft"]
    assert ttft["count"] > 0 and ttft["p50_s"] is not None and ttft["p50_s"] <= ttft["p99_s"]


def test_offload_fixture_gives_transfer_rates_and_pinned_size() -> None:
    snap = parse_snapshot((FIXTURES / "synthetic__qwen3-8b-h200__native-cpu-offload.prom").read_text())
    d = delta(Snapshot(), snap, 60.0)
    assert d["load_bytes"] > 0 and d["load_gbps"] > 0 and d["store_gbps"] > 0
    assert d["configured_offload_bytes"] and d["configured_offload_bytes"] > 0
    assert d["share_by_source"]["external_kv_transfer"] > 0
    none = parse_snapshot((FIXTURES / "synthetic__qwen3-8b-h200__no-offload.prom").read_text())
    assert delta(Snapshot(), none, 60.0)["configured_offload_bytes"] == 0


def test_delta_flags_counters_that_went_down() -> None:
    before = Snapshot(
        counters={"vllm:prompt_tokens_total": 100.0},
        by_source={"local_compute": 100.0},
        buckets={"vllm:time_to_first_token_seconds": {0.1: 5.0, float("inf"): 5.0}},
    )
    after = Snapshot(
        counters={"vllm:prompt_tokens_total": 20.0},
        by_source={"local_compute": 20.0},
        buckets={"vllm:time_to_first_token_seconds": {0.1: 1.0, float("inf"): 1.0}},
    )
    d = delta(before, after, 1.0)
    assert d["valid"] is False and d["prompt_tokens"] is None and len(d["problems"]) == 3
    assert "ttft" not in d["server"]


def test_histogram_quantile_like_prometheus() -> None:
    b = {0.01: 0.0, 0.05: 50.0, 0.1: 100.0, float("inf"): 100.0}
    assert histogram_quantile(0.5, b) == pytest.approx(0.05)
    assert histogram_quantile(0.75, b) == pytest.approx(0.075)
    assert histogram_quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert histogram_quantile(0.99, {0.1: 1.0, float("inf"): 10.0}) == 0.1  # in +Inf: highest finite bound
    assert histogram_quantile(0.5, {}) is None


def test_configured_offload_bytes_tolerates_garbage() -> None:
    assert configured_offload_bytes({}) is None
    assert configured_offload_bytes({"kv_offloading_size": "None"}) == 0
    assert configured_offload_bytes({"kv_offloading_size": "8"}) == 8 * 1024**3
    assert configured_offload_bytes({"kv_offloading_size": "lots"}) is None
    assert configured_offload_bytes({"kv_offloading_size": "nan"}) is None
    assert parse_snapshot("garbage\n# TYPE x y\n{{{").counters == {}


# ---------------------------------------------------------------- runner and drivers on a fake server
class FakeVllm:
    """Enough of vLLM's HTTP surface for the runner: models, version, reset (404 unless dev), metrics,
    completions that count prompt tokens. Time is a fake clock the drivers advance by sleeping."""

    def __init__(self, dev_mode: bool = True, fail_metrics: bool = False) -> None:
        self.dev_mode, self.fail_metrics = dev_mode, fail_metrics
        self.prompt_tokens = 0
        self.paths: list[str] = []

    def __call__(self, req: httpx.Request) -> httpx.Response:
        self.paths.append(req.url.path)
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "root": "/models/m", "max_model_len": 2048}]})
        if req.url.path == "/version":
            return httpx.Response(200, json={"version": "0.32.0"})
        if req.url.path == "/reset_prefix_cache":
            return httpx.Response(200 if self.dev_mode else 404)
        if req.url.path == "/metrics":
            if self.fail_metrics:
                return httpx.Response(500)
            return httpx.Response(
                200,
                text=(
                    "# TYPE vllm:prompt_tokens counter\n"
                    f'vllm:prompt_tokens_total{{model_name="m",engine="0"}} {self.prompt_tokens}\n'
                ),
            )
        body = json.loads(req.content)
        self.prompt_tokens += len(body["prompt"].split())
        return httpx.Response(
            200,
            json={
                "choices": [{"text": "x"}],
                "usage": {"prompt_tokens": len(body["prompt"].split()), "completion_tokens": 1},
            },
        )


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def test_runner_brackets_the_run_and_reports_a_real_server_as_client_timed() -> None:
    fake = FakeVllm()
    spec = parse_workload(
        {"kind": "probe", "prefix_tokens": 20, "evict_prefixes": 1, "repetitions": 2, "stream": False}
    )
    rec = execute_run("http://v", spec, run_key="k", client=_client(fake))
    assert rec["ok"] and rec["reset"] == "ok" and rec["timing_source"] == "client"
    assert rec["server"] == {
        "model": "m",
        "model_root": "/models/m",
        "version": "0.32.0",
        "simulated": False,
        "max_model_len": 2048,
    }
    assert [r["tag"] for r in rec["requests"]] == ["cold", "hit", "evict", "reload"] * 2
    assert rec["counters"]["prompt_tokens"] == 8 * 20  # warm-up outside the bracket
    assert fake.paths.index("/reset_prefix_cache") < fake.paths.index("/v1/completions")
    assert reset_caches(_client(FakeVllm(dev_mode=False)), "http://v").startswith("unavailable")
    assert server_info(_client(lambda r: httpx.Response(500)), "http://v")["model"] is None


def test_runner_without_metrics_is_a_failed_run() -> None:
    rec = execute_run(
        "http://v",
        parse_workload({"kind": "probe", "prefix_tokens": 20, "stream": False}),
        run_key="k",
        client=_client(FakeVllm(fail_metrics=True)),
    )
    assert not rec["ok"] and "cannot read /metrics before the run" in rec["error"]


def test_replay_waits_for_recorded_offsets_and_observe_waits_its_window() -> None:
    fake, ft = FakeVllm(), FakeTime()
    spec = WorkloadSpec(
        kind="replay",
        concurrency=1,
        speed=2.0,
        stream=False,
        records=[
            {"prompt": "a b", "offset_s": 0.0},
            {"prompt": "c d e", "offset_s": 4.0},
            {"prompt": "f", "max_tokens": 2},
        ],
    )
    from agent.workloads import observe, replay

    ctx = RunContext(
        client=_client(fake),
        base_url="http://v",
        model="m",
        spec=spec,
        run_key="r",
        clock=ft.clock,
        sleep=ft.sleep,
        t0=ft.t,
    )
    replay.run(ctx)
    assert [r.prompt_tokens for r in ctx.results] == [2, 3, 1]
    assert sum(ft.slept) == pytest.approx(2.0)  # offset 4 s at 2x speed
    ft2 = FakeTime()
    octx = RunContext(
        client=_client(fake),
        base_url="http://v",
        model="m",
        spec=WorkloadSpec(kind="observe", window_s=5.0),
        run_key="o",
        clock=ft2.clock,
        sleep=ft2.sleep,
        t0=ft2.t,
    )
    observe.run(octx)
    assert sum(ft2.slept) == pytest.approx(5.0) and octx.results == []


def test_observe_run_has_no_synthetic_requests_and_no_reset() -> None:
    fake, ft = FakeVllm(), FakeTime()
    rec = execute_run(
        "http://v",
        WorkloadSpec(kind="observe", window_s=3.0),
        run_key="o",
        client=_client(fake),
        clock=ft.clock,
        sleep=ft.sleep,
    )
    assert rec["ok"] and rec["reset"] == "skipped" and rec["requests"] == []
    assert "/v1/completions" not in fake.paths and rec["elapsed_s"] == pytest.approx(3.0)


def test_prefix_repetition_runs_concurrently_over_shared_prefixes() -> None:
    import threading

    lock = threading.Lock()
    state = {"in_flight": 0, "peak": 0}
    fake = FakeVllm()

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path != "/v1/completions":
            return fake(req)
        with lock:
            state["in_flight"] += 1
            state["peak"] = max(state["peak"], state["in_flight"])
        time.sleep(0.05)  # keeps requests overlapping; nothing asserts on time
        try:
            return fake(req)
        finally:
            with lock:
                state["in_flight"] -= 1

    spec = parse_workload(
        {
            "kind": "prefix-repetition",
            "num_prefixes": 3,
            "prefix_tokens": 40,
            "suffix_tokens": 5,
            "requests": 24,
            "concurrency": 4,
            "distribution": "round-robin",
            "stream": False,
        }
    )
    rec = execute_run("http://v", spec, run_key="pr", client=_client(handler))
    assert rec["ok"] and len(rec["requests"]) == 24
    assert [r["tag"] for r in rec["requests"]].count("first") == 3
    assert rec["counters"]["prompt_tokens"] == 24 * 45
    assert 1 < state["peak"] <= 4
