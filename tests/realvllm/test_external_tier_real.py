"""Issue 6 (1), the external tier: vLLM's own ExampleConnector stores KV blocks as files on disk,
so on the CPU build an evicted prefix comes back "reloaded, not recomputed"
(prompt_tokens_by_source{external_kv_transfer}), as an offload tier would on a GPU server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realvllm.captures import agent_capture, keep_or_compare
from tests.realvllm.readings import SOURCES, AgentView, delta, send
from tests.realvllm.server import Server
from tests.realvllm.workload import PREFIX, TAIL, tokens

# vLLM starts take minutes on a busy 2-core machine (pyproject's default is 600 s per test).
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def store_dir(connector_store: Path) -> Path:
    return connector_store


@pytest.fixture(scope="module")
def server(connector_server: Server) -> Server:
    return connector_server


@pytest.fixture(scope="module")
def agent(server: Server) -> Iterator[AgentView]:
    view = AgentView(server.url)
    try:
        yield view
    finally:
        view.close()


def test_evicted_prefix_is_reloaded_from_the_external_tier(server: Server, agent: AgentView, store_dir: Path) -> None:
    prefix = tokens(300, PREFIX)
    r0 = agent.read()
    r1 = send(server.url, agent, prefix + tokens(301, TAIL))  # cold: computed, stored to disk
    d_cold = delta(r1, r0)
    assert d_cold["src:local_compute"] == PREFIX + TAIL, d_cold
    assert any(store_dir.rglob("*")), "ExampleConnector stored nothing on disk"

    r = r1
    for i in range(4):  # evict the prefix from the 24-block GPU pool
        r = send(server.url, agent, tokens(400 + i, 1100))
    r2 = send(server.url, agent, prefix + tokens(302, TAIL))  # again: back from the disk store
    d = delta(r2, r)
    print(f"\nExampleConnector reload deltas: {d}")
    # The whole 8-block prefix comes back from disk; only the unique tail is computed.
    assert d["src:external_kv_transfer"] == PREFIX, d
    assert d["src:local_compute"] == TAIL, d
    assert d["src:local_cache_hit"] == 0, d
    # Not found on the GPU -> asked of the connector: the whole prompt.
    assert d["vllm:external_prefix_cache_queries_total"] == PREFIX + TAIL, d
    assert d["vllm:external_prefix_cache_hits_total"] == d["src:external_kv_transfer"], d
    assert (
        r2.value("vllm:prompt_tokens_cached_by_source_total", source="external_unspecified")
        - r.value("vllm:prompt_tokens_cached_by_source_total", source="external_unspecified")
        == d["src:external_kv_transfer"]
    )
    # The connector's own gauge, kept by the agent (num_requests_* prefix).
    assert "vllm:num_requests_kv_fetch_by_stage" in r2.names()
    assert sum(r2.by_source(s) for s in SOURCES) == r2.value("vllm:prompt_tokens_total")


def test_capture_with_the_external_tier(server: Server, tmp_path: Path) -> None:
    files = agent_capture(server.url, tmp_path)
    text = files["metrics.prom"].read_text()
    assert "vllm:num_requests_kv_fetch_by_stage" in text
    keep_or_compare(files["metrics.prom"], "tiny-llama__example-connector.prom")
