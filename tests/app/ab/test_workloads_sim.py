"""The workload drivers against a real `kvscope sim` process (laptop reranker profile, 2,336-token
GPU pool): bracketed runs, cache reset in dev mode, counter deltas, the sim's modeled TTFT."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.workloads.runner import execute_run
from agent.workloads.spec import parse_workload
from app.ab.results import summarise_run
from tests.ports import free_port
from tests.waits import wait_until

KVSCOPE = str(Path(sys.executable).parent / "kvscope")
LAPTOP = [
    "--profile",
    "laptop8gb-qwen3-reranker-0.6b",
    "--kv-cache-memory-bytes",
    "268435456",
    "--max-model-len",
    "2048",
]
OFFLOAD = ["--kv-offloading-size", "0.5", "--kv-offloading-backend", "native"]
PROBE = {"kind": "probe", "prefix_tokens": 1500, "repetitions": 2}  # evicting prefixes: auto


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*extra: str, dev_mode: bool = True) -> str:
        port = free_port()
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0"}
        log = (tmp_path / f"sim-{port}.log").open("wb")
        p = subprocess.Popen(
            [
                KVSCOPE,
                "sim",
                *LAPTOP,
                *extra,
                "--port",
                str(port),
                "--sim-shm-dir",
                str(tmp_path),
                "--sim-time-scale",
                "5",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: httpx.get(url + "/health", timeout=2).status_code == 200,
            "the sim to become healthy",
            timeout=60.0,
            interval=0.1,
            abort=lambda: None if p.poll() is None else (tmp_path / f"sim-{port}.log").read_text()[-2000:],
        )
        return url

    try:
        yield start
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_probe_run_without_and_with_offload(sim: Any) -> None:
    spec = parse_workload(PROBE)
    results = {}
    for name, extra in (("none", []), ("offload", OFFLOAD)):
        url = sim(*extra)
        rec = execute_run(url, spec, run_key=f"t-{name}")
        assert rec["ok"], rec.get("error")
        assert rec["reset"] == "ok"
        assert rec["server"]["simulated"] is True and rec["server"]["model"]
        assert rec["timing_source"] == "sim-model"
        # auto: the 2,336-token GPU pool + one block, in 2 prefixes no longer than the probed one
        d = rec["driver"]
        assert (d["evict_prefixes"], d["evict_tokens"], d["pool_tokens"]) == (2, 1176, 2336)
        tiers = d["plan"]["tiers"]
        if name == "none":
            assert tiers == [] and "no offload tier" in d["plan"]["text"]
        else:  # 0.5 GiB at 114,688 B/token, from the server's kv_offload_config_info
            assert [t["name"] for t in tiers] == ["CPU"] and 4500 < tiers[0]["tokens"] < 4700
            assert d["plan"]["feasible"] and "the CPU tier keeps it" in d["plan"]["text"]
        assert rec["foreign"]["requests"] == 0 and rec["foreign"]["prompt_tokens"] == 0  # nobody else sent
        tags = [r["tag"] for r in rec["requests"]]
        assert tags == ["cold", "hit", "evict", "evict", "reload"] * 2
        assert all(r["ok"] and r["ttft_s"] > 0 and r["prompt_tokens"] > 1100 for r in rec["requests"])
        c = rec["counters"]
        assert c["valid"] and c["prompt_tokens"] == sum(r["prompt_tokens"] for r in rec["requests"])
        assert c["server"]["ttft"]["count"] == 10  # the warm-up request is outside the bracket
        results[name] = (rec, summarise_run(rec, ("reload",)))
    (_, s_a), (rec_b, s_b) = results["none"], results["offload"]
    # The sim's modeled reload TTFT: recomputed ~77 ms vs reloaded ~35 ms (DOMAIN.md, laptop reranker).
    assert 60 < s_a["focus_ttft_p50_ms"] < 90 and 25 < s_b["focus_ttft_p50_ms"] < 45
    assert s_a["share_external_kv_transfer"] == 0 and s_b["share_external_kv_transfer"] > 0
    assert s_a["ttft_hit_p50_ms"] < 20 and s_b["ttft_hit_p50_ms"] < 20
    assert rec_b["counters"]["load_bytes"] > 0 and rec_b["counters"]["load_gbps"] > 1
    assert s_a["configured_offload_bytes"] == 0 and s_b["configured_offload_bytes"] == 512 * 1024**2


def test_reset_unavailable_outside_dev_mode_and_prefix_repetition(sim: Any) -> None:
    url = sim(*OFFLOAD, dev_mode=False)
    spec = parse_workload(
        {
            "kind": "prefix-repetition",
            "num_prefixes": 4,
            "prefix_tokens": 600,
            "requests": 16,
            "concurrency": 4,
            "suffix_tokens": 8,
            "max_tokens": 8,
        }
    )
    rec = execute_run(url, spec, run_key="pr")
    assert rec["ok"], rec.get("error")
    assert rec["reset"].startswith("unavailable")
    assert len(rec["requests"]) == 16 and all(r["ok"] for r in rec["requests"])
    assert {r["tag"] for r in rec["requests"]} == {"first", "shared"}
    s = summarise_run(rec)
    assert s["errors"] == 0 and s["throughput_tok_s"] > 0 and s["output_tokens"] == 16 * 8
    assert s["share_local_cache_hit"] > 0  # the shared prefixes hit


def test_cancel_stops_between_requests(sim: Any) -> None:
    url = sim()
    calls = {"n": 0}

    def cancelled() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    rec = execute_run(url, parse_workload({**PROBE, "repetitions": 5}), run_key="c", cancelled=cancelled)
    assert rec["cancelled"] is True and rec["ok"] is False and rec["error"] == "cancelled"
    assert 0 < len(rec["requests"]) < 25


def test_foreign_traffic_during_a_run_is_measured_and_flags_the_run(sim: Any) -> None:
    """Another client (the demo's traffic generator) sends during the run: the run's record counts
    the requests and prompt tokens it did not send, from the server's own counters."""
    from app.ab.results import contamination
    from kvscope.traffic import Mix, Traffic

    url = sim(*OFFLOAD)
    spec = parse_workload({"kind": "probe", "prefix_tokens": 600, "evict_prefixes": 2, "repetitions": 2})
    other = Traffic(url, "Qwen/Qwen3-Reranker-0.6B", mix=Mix(documents=2, document_words=200), rate=20.0, workers=2)
    other.start()
    try:
        rec = execute_run(url, spec, run_key="dirty")
    finally:
        other.stop()
    assert rec["ok"], rec.get("error")
    f = rec["foreign"]
    assert f["sent"] == 10 and f["requests"] is not None and f["requests"] > 0
    assert f["prompt_tokens"] is not None and f["prompt_tokens"] > 0
    reason = contamination(rec, 0.05)
    assert reason is not None and f"{f['requests']} requests" in reason
    clean = execute_run(url, spec, run_key="clean")  # the generator stopped: nothing foreign
    assert clean["foreign"]["requests"] == 0 and contamination(clean, 0.05) is None
