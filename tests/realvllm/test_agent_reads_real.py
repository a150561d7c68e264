"""Issue 6 (1): the agent reads a real `vllm serve`; prompt tokens move to the right source.

One server (CPU build, --num-gpu-blocks-override 24: a 3,072-token pool of 128-token blocks) for
the whole module. The prefix sequence is the field method: cold, again (GPU prefix hit), enough
other prompts to evict it, again (recomputed).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.realvllm.behaviour import differences, record
from tests.realvllm.captures import agent_capture, keep_or_compare
from tests.realvllm.conftest import ServerPool
from tests.realvllm.readings import DASHBOARD_SAMPLES, DASHBOARD_TYPES, SOURCES, AgentView, delta, read_until, send
from tests.realvllm.server import Server, http_get
from tests.realvllm.workload import BLOCK, POOL_BLOCKS, PREFIX, TAIL, complete, tokens
from tests.waits import wait_until

# vLLM starts take minutes on a busy 2-core machine (pyproject's default is 600 s per test).
pytestmark = pytest.mark.timeout(1200)

FLAGS = ("--enforce-eager", "--num-gpu-blocks-override", str(POOL_BLOCKS))


@pytest.fixture(scope="module")
def server(vllm_pool: ServerPool) -> Server:
    return vllm_pool.get(FLAGS)


@pytest.fixture(scope="module")
def agent(server: Server) -> Iterator[AgentView]:
    view = AgentView(server.url)
    try:
        yield view
    finally:
        view.close()


def test_every_dashboard_family_is_found_and_normalised(server: Server, agent: AgentView) -> None:
    complete(server.url, tokens(1, 300), max_tokens=4)  # so the histograms have observations
    reading = read_until(agent, lambda r: r.value("vllm:time_to_first_token_seconds_count") >= 1, "a TTFT")
    scrape = reading.scrape
    assert scrape.healthy is True
    assert scrape.simulated is False
    assert scrape.model == "tiny"
    assert scrape.version == "0.32.0"
    assert scrape.max_model_len == 2048
    assert scrape.model_root and scrape.model_root.endswith("tiny-llama")

    names = reading.names()
    missing = [n for n in DASHBOARD_SAMPLES if n not in names]
    assert not missing, f"families the dashboard needs, missing from the agent's scrape: {missing}"
    for fam, kind in DASHBOARD_TYPES.items():
        assert scrape.types.get(fam) == kind, f"{fam}: type {scrape.types.get(fam)!r}, want {kind}"
    # Normalised: current names only, no _created samples, every engine sample labelled.
    old = {
        n
        for n in names
        if n.startswith(("vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_", "vllm:time_per_output_token_seconds"))
    }
    assert not old, f"older names sent: {old}"
    assert not [n for n in names if n.endswith("_created")]
    for s in scrape.samples:
        if s.name.startswith("vllm:"):
            assert s.labels.get("engine") == "0", s
            # cache_config_info is the one engine family without model_name on the real server.
            if s.name != "vllm:cache_config_info":
                assert s.labels.get("model_name") == "tiny", s
    assert {s.labels["source"] for s in scrape.samples if s.name == "vllm:prompt_tokens_by_source_total"} >= set(
        SOURCES
    )
    # The configured pool, as the controller and the dashboard read it.
    cfg = reading.labels_of("vllm:cache_config_info")
    assert cfg["block_size"] == str(BLOCK)
    assert cfg["num_gpu_blocks"] == str(POOL_BLOCKS)
    assert cfg["num_gpu_blocks_override"] == str(POOL_BLOCKS)
    assert cfg["enable_prefix_caching"] == "True"
    assert cfg["cache_dtype"] == "auto"
    assert cfg["kv_offloading_size"] == "None"
    # Buckets end at +Inf and are cumulative.
    buckets = sorted(
        (
            (float(s.labels["le"]), s.value)
            for s in scrape.samples
            if s.name == "vllm:time_to_first_token_seconds_bucket"
        ),
    )
    assert buckets[-1][0] == float("inf")
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(buckets))
    assert buckets[-1][1] == reading.value("vllm:time_to_first_token_seconds_count")


def test_agent_values_equal_prometheus_client(server: Server, agent: AgentView) -> None:
    """Every value the agent keeps equals what prometheus_client reads from the same text."""
    from prometheus_client.parser import text_string_to_metric_families

    reading = agent.read()
    status, _, body = http_get(server.url + "/metrics")
    assert status == 200
    reference: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for ref in fam.samples:
            reference[(ref.name, tuple(sorted(ref.labels.items())))] = ref.value
    idle = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
    compared = 0
    for s in reading.scrape.samples:
        if s.name == "process_start_time_seconds" or s.name in idle:
            continue
        key = (s.name, tuple(sorted(s.labels.items())))
        assert key in reference, f"{key} sent by the agent but not in vLLM's /metrics"
        assert s.value == reference[key], key
        compared += 1
    assert compared > 50


def test_prefix_hit_then_eviction_moves_the_right_sources(server: Server, agent: AgentView) -> None:
    prefix = tokens(100, PREFIX)
    r0 = agent.read()
    r1 = send(server.url, agent, prefix + tokens(101, TAIL))  # cold
    d_cold = delta(r1, r0)
    assert d_cold["src:local_compute"] == PREFIX + TAIL
    assert d_cold["src:local_cache_hit"] == 0

    r2 = send(server.url, agent, prefix + tokens(102, TAIL))  # the prefix again: GPU prefix cache
    d_hit = delta(r2, r1)
    assert d_hit["src:local_cache_hit"] == PREFIX, d_hit
    assert d_hit["src:local_compute"] == TAIL, d_hit
    assert d_hit["vllm:prefix_cache_hits_total"] == PREFIX, d_hit
    assert d_hit["vllm:prefix_cache_queries_total"] == PREFIX + TAIL, d_hit
    assert d_hit["vllm:prompt_tokens_cached_total"] == PREFIX, d_hit
    assert (
        r2.value("vllm:prompt_tokens_cached_by_source_total", source="device")
        - r1.value("vllm:prompt_tokens_cached_by_source_total", source="device")
        == PREFIX
    )

    # Evict: other prompts totalling well over the 24-block pool, LRU pushes the prefix out.
    r = r2
    for i in range(4):
        r = send(server.url, agent, tokens(200 + i, 1100))
    r3 = send(server.url, agent, prefix + tokens(103, TAIL))  # the prefix again: recomputed
    d_evicted = delta(r3, r)
    assert d_evicted["src:local_cache_hit"] == 0, d_evicted
    assert d_evicted["src:local_compute"] == PREFIX + TAIL, d_evicted
    assert d_evicted["src:external_kv_transfer"] == 0, d_evicted

    # The invariant vLLM documents, on the real counters.
    total = sum(r3.by_source(s) for s in SOURCES)
    assert total == r3.value("vllm:prompt_tokens_total")
    assert r3.value("vllm:prompt_tokens_cached_total") == r3.by_source("local_cache_hit") + r3.by_source(
        "external_kv_transfer"
    )
    assert not [e for e in agent.events if e.kind in ("counter_reset", "counter_clamped", "restart")]


def test_kvscope_agent_capture_keeps_a_real_sample(server: Server, tmp_path: Path) -> None:
    """Issue 6 (4): `kvscope agent capture` of the real server; the committed fixtures that the
    parser tests run on still have the live server's shape."""
    files = agent_capture(server.url, tmp_path)
    models = json.loads(files["v1_models.json"].read_text())
    assert models["data"][0]["id"] == "tiny"
    assert models["data"][0]["max_model_len"] == 2048
    assert json.loads(files["version.json"].read_text()) == {"version": "0.32.0"}
    keep_or_compare(files["metrics.prom"], "tiny-llama__evicted.prom")
    # tests/agent pins values of these two (e.g. the masked root path): compared, never rewritten.
    keep_or_compare(files["v1_models.json"], "v1_models.json", may_update=False)
    keep_or_compare(files["version.json"], "version.json", may_update=False)
    # The capture parses with the agent's own CLI, with nothing unreadable.
    proc = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "agent", "parse", str(files["metrics.prom"])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    parsed = json.loads(proc.stdout)
    assert parsed["bad_lines"] == 0
    assert parsed["dropped_duplicates"] == 0
    assert {"vllm:prompt_tokens_by_source", "vllm:cache_config_info", "vllm:prefix_cache_hits"} <= set(
        parsed["families"]
    )


def test_the_simulator_answers_like_the_real_server(server: Server, tmp_path: Path) -> None:
    """The stand-in against the real thing, on everything kvscope relies on (families, types,
    labels, label values, cache_config_info's label set, status codes, error objects). The other
    differences are printed (and listed in docs/realvllm.md) for the simulator team.
    Runs last in the module: it sends its own requests to the shared server."""
    real = record(server.url, "tiny", 2048)
    port = free_port()
    log = (tmp_path / "sim.log").open("wb")
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvscope.cli",
            "sim",
            "--profile",
            "tiny",
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
            "--max-model-len",
            "2048",
            "--enable-prefix-caching",
            "--num-gpu-blocks-override",
            str(POOL_BLOCKS),
            "--block-size",
            "128",
            "--sim-state-dir",
            str(tmp_path / "sim-state"),
            "--sim-shm-dir",
            str(tmp_path / "shm"),
            "--uvicorn-log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"},
        start_new_session=True,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: http_get(url + "/health", timeout=2)[0] == 200,
            "kvscope sim to become healthy",
            timeout=60.0,
            interval=0.2,
            abort=lambda: None if sim.poll() is None else (tmp_path / "sim.log").read_text()[-2000:],
        )
        simulated = record(url, "tiny", 2048)
    finally:
        if sim.poll() is None:
            os.killpg(sim.pid, signal.SIGTERM)
        sim.wait(30)
    core, other = differences(real, simulated)
    print("\nsimulator vs real vLLM 0.32.0 (CPU), outside what kvscope relies on:\n  " + "\n  ".join(other))
    assert not core, "the simulator differs from the real server:\n" + "\n".join(core)
