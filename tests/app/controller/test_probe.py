"""The verification probe against a scripted server (httpx.MockTransport): steps, deltas, failures."""

from __future__ import annotations

from typing import Any

import httpx

from agent.probe import ProbeConfig, counters_from_text, make_prefix, run_probe
from tests.paths import FIXTURES


class Server:
    """Counts prompt tokens by source like vLLM: first sight computed, repeat a GPU hit, the
    reload step an external transfer. `fail` makes the reload request crash or hang."""

    def __init__(self, fail: str | None = None) -> None:
        self.seen: set[str] = set()
        self.counts = {"local_compute": 0.0, "local_cache_hit": 0.0, "external_kv_transfer": 0.0}
        self.fail = fail
        self.requests = 0

    def __call__(self, req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "root": "/m"}]})
        if req.url.path == "/metrics":
            lines = [
                f'vllm:prompt_tokens_by_source_total{{engine="0",source="{k}"}} {v}' for k, v in self.counts.items()
            ]
            total = sum(self.counts.values())
            text = (
                "# TYPE vllm:prompt_tokens_by_source_total counter\n"
                + "\n".join(lines)
                + f'\n# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{engine="0"}} {total}\n'
            )
            return httpx.Response(200, text=text)
        if req.url.path == "/v1/completions":
            import json

            self.requests += 1
            prompt = json.loads(req.content)["prompt"]
            words = float(len(prompt.split()))
            key = prompt.split(".")[0]
            if key in self.seen and self.requests > 3:  # the reload step
                if self.fail == "crash":
                    return httpx.Response(500, json={"error": "EngineCore encountered an issue"})
                if self.fail == "hang":
                    raise httpx.ReadTimeout("timed out", request=req)
                self.counts["external_kv_transfer"] += words
            elif key in self.seen:
                self.counts["local_cache_hit"] += words
            else:
                self.counts["local_compute"] += words
            self.seen.add(key)
            return httpx.Response(200, json={"choices": [{"text": "x"}]})
        return httpx.Response(404)


def _run(server: Server, **kw: Any) -> Any:
    client = httpx.Client(transport=httpx.MockTransport(server), base_url="http://sim")
    ticks = iter(range(1000))
    return run_probe(
        "http://sim",
        config=ProbeConfig(prefix_words=50, evict_count=2, nonce="n", **kw),
        client=client,
        clock=lambda: float(next(ticks)) * 0.01,
    )


def test_probe_steps_and_deltas() -> None:
    r = _run(Server())
    assert r.ok and r.model == "m"
    assert [s.name for s in r.steps] == ["cold", "gpu_hit", "evict_1", "evict_2", "reload"]
    assert r.steps[0].deltas["local_compute"] > 50 and r.steps[1].deltas["local_cache_hit"] > 50
    assert r.reload_source == "external_kv_transfer"
    assert all(s.ttft_s is not None for s in r.steps)
    d = r.to_dict()
    assert set(d["ttft_s"]) == {"cold", "gpu_hit", "reload"}
    assert d["deltas"]["prompt_tokens"] == sum(
        d["deltas"][k] for k in ("local_compute", "local_cache_hit", "external_kv_transfer")
    )


def test_probe_crash_and_hang() -> None:
    crash = _run(Server("crash"))
    assert not crash.ok and crash.failure == "crash" and crash.steps[-1].status == 500
    hang = _run(Server("hang"), request_timeout_s=3)
    assert not hang.ok and hang.failure == "hang" and "no answer within 3 s" in hang.message


def test_probe_errors() -> None:
    def bad_request(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if req.url.path == "/v1/completions":
            return httpx.Response(400, json={"error": "prompt longer than max_model_len"})
        return httpx.Response(200, text="garbage {{{")

    client = httpx.Client(transport=httpx.MockTransport(bad_request))
    r = run_probe("http://x", config=ProbeConfig(prefix_words=5, evict_count=0), client=client)
    assert not r.ok and r.failure == "error" and "max_model_len" in r.message
    none = httpx.Client(transport=httpx.MockTransport(lambda req: httpx.Response(200, json={"data": []})))
    assert run_probe("http://x", client=none).failure == "error"


def test_prefixes_are_deterministic_and_distinct() -> None:
    assert make_prefix("n", 0, 20) == make_prefix("n", 0, 20)
    assert make_prefix("n", 0, 20) != make_prefix("n", 1, 20)
    assert len(make_prefix("n", 0, 20).split()) == 22
    assert counters_from_text("not prometheus {") == {}
    assert ProbeConfig.from_dict({"prefix_words": "x", "evict_count": 3, "request_timeout_s": -1}).evict_count == 3


class OlderNamesServer(Server):
    """A vLLM that still exports the older names the normaliser maps (fixtures/vllm/NOTES.md):
    vllm:gpu_prefix_cache_{queries,hits} and vllm:kv_offload_total_bytes{transfer_type}."""

    def __call__(self, req: httpx.Request) -> httpx.Response:
        r = super().__call__(req)
        if req.url.path != "/metrics":
            return r
        hits = self.counts["local_cache_hit"]
        loaded = self.counts["external_kv_transfer"] * 4096
        older = (
            "# TYPE vllm:gpu_prefix_cache_queries counter\n"
            f'vllm:gpu_prefix_cache_queries_total{{engine="0"}} {sum(self.counts.values())}\n'
            "# TYPE vllm:gpu_prefix_cache_hits counter\n"
            f'vllm:gpu_prefix_cache_hits_total{{engine="0"}} {hits}\n'
            "# TYPE vllm:kv_offload_total_bytes counter\n"
            f'vllm:kv_offload_total_bytes_total{{engine="0",transfer_type="CPU_to_GPU"}} {loaded}\n'
            f'vllm:kv_offload_total_bytes_total{{engine="0",transfer_type="GPU_to_CPU"}} {loaded}\n'
        )
        return httpx.Response(200, text=r.text + older)


def test_the_probe_reads_older_vllm_names_through_the_agents_normaliser() -> None:
    r = _run(OlderNamesServer())
    assert r.ok and r.reload_source == "external_kv_transfer"
    gpu_hit, reload = r.steps[1].deltas, r.steps[-1].deltas
    assert gpu_hit["prefix_cache_hits"] == gpu_hit["local_cache_hit"] > 50
    assert gpu_hit["prefix_cache_queries"] == gpu_hit["prompt_tokens"]
    assert reload["kv_offload_load_bytes"] == reload["external_kv_transfer"] * 4096 > 0


def test_a_server_exporting_older_and_current_names_is_counted_once_by_the_probe() -> None:

    prom = FIXTURES / "vllm" / "synthetic__qwen3-8b-h200__native-cpu-offload.prom"
    got = counters_from_text(prom.read_text())
    assert got["kv_offload_load_bytes"] == 1.04476704768e11  # not twice: the older split name is shadowed
    assert got["kv_offload_store_bytes"] == 3.00201541632e11
