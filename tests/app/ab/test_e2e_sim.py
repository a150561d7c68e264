"""End to end, as issue 9's "Done means" asks: the app (in-process) runs an A/B experiment whose
profile switches go through the controller's real rollouts (agent push loop -> Controller ->
subprocess launcher -> `kvscope sim`) and whose workload runs app-side over HTTP against the sim.

- laptop reranker profile, GPU pool 2,336 tokens: A = no offload, B = 0.5 GiB offload, probe
  workload: B wins on reload TTFT with a CI excluding zero; external_kv_transfer share > 0 only in B;
- hybrid profile + offload forced: the controller's verification probe crashes the engine, the agent
  rolls back, the experiment ends failed with that reason and the instance on its previous profile.

TTFTs compared are the sim's modeled ones (x-kvscope-sim-ttft-ms): nothing asserts on wall-clock time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e_rig import e2e_rig

pytestmark = pytest.mark.slow
LAPTOP_POOL = {"kv_cache_memory_bytes": 268435456, "max_model_len": 2048}


@pytest.fixture
def rig_factory(tmp_path: Path, settings: Any, engine: Any) -> Iterator[Any]:
    settings.controller.probe_evict_count = 4
    settings.controller.probe_prefix_words = 1400
    settings.ab.bootstrap_resamples = 500
    with e2e_rig(tmp_path, settings, engine, time_scale=5, env={"VLLM_SERVER_DEV_MODE": "1"}, settle_steps=0) as made:
        yield made


def _profile(client: Any, name: str, spec: dict[str, Any]) -> None:
    r = client.post("/api/v1/profiles", json={"name": name, "spec": spec})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("executor", ["app", "agent"])
def test_offload_b_wins_on_reload_ttft_and_only_b_reloads(rig_factory: Any, executor: str) -> None:
    make, client = rig_factory
    rig = make(  # seeded run-to-run noise (simulated): a deterministic server gives zero-width intervals
        ["--profile", "laptop8gb-qwen3-reranker-0.6b", "--sim-jitter", "0.05"],
        ["--kv-cache-memory-bytes", "268435456", "--max-model-len", "2048"],
    )
    _profile(client, "laptop-no-offload", LAPTOP_POOL)
    _profile(client, "laptop-offload-0.5", {**LAPTOP_POOL, "offload_size_gib": 0.5})
    assert rig.apply("laptop-no-offload")["state"] == "healthy"
    exp = rig.experiment(
        {
            "b": "laptop-offload-0.5",
            "runs": 3,
            "seed": 7,
            "executor": executor,
            "workload": {"kind": "probe", "prefix_tokens": 1500, "evict_prefixes": 2, "repetitions": 3},
        }
    )
    assert exp["state"] == "completed", exp["message"]
    assert exp["profile_a"] == "laptop-no-offload"
    v = exp["verdict"]
    reload_p50 = next(m for m in v["headline"] if m["key"] == "ttft_p50")
    assert reload_p50["significant"] and reload_p50["better"] == "B" and reload_p50["hi"] < 0, reload_p50
    assert "B cut TTFT p50 on evicted prefixes" in v["summary"]
    runs = exp["runs"]
    assert [r["arm"] for r in runs] == ["A", "B"] * 3 and all(r["state"] == "done" for r in runs)
    for r in runs:
        share = r["summary"]["share_external_kv_transfer"]
        assert (share > 0) if r["arm"] == "B" else (share == 0), r
        assert r["simulated"] and r["reset"] == "ok" and r["summary"]["timing_source"] == "sim-model"
        assert r["rollout_id"] is not None  # every run started from a restart, the first one too
        assert r["foreign"]["requests"] == 0 and not r["contaminated"]  # nobody else sent anything
    assert "--kv-offloading-size" in " ".join(runs[1]["argv"]) and "--kv-offloading-size" not in runs[0]["argv"]
    ip = client.get(f"/api/v1/instances/{rig.instance_id()}/profile").json()
    assert ip["current"]["name"] == "laptop-no-offload"  # back on A at the end
    if executor == "agent":  # the records came back as agent events, one per run
        evs = client.get(f"/api/v1/events?instance={rig.instance_id()}").json()["events"]
        assert sum(1 for e in evs if e["message"].startswith("A/B workload run")) == 6


def test_failing_arm_hybrid_offload_forced_ends_failed_back_on_previous(rig_factory: Any) -> None:
    make, client = rig_factory
    base = ["--num-gpu-blocks-override", "8", "--max-model-len", "4096"]
    rig = make(["--profile", "rtx4070-qwen3.5-4b", "--hybrid-failure", "crash"], base)
    _profile(client, "hyb-base", {"max_model_len": 4096, "extra_args": ["--num-gpu-blocks-override", "8"]})
    _profile(
        client,
        "hyb-off8",
        {"offload_size_gib": 8, "max_model_len": 4096, "extra_args": ["--num-gpu-blocks-override", "8"]},
    )
    assert rig.apply("hyb-base")["state"] == "healthy"
    exp = rig.experiment(
        {
            "b": "hyb-off8",
            "runs": 2,
            "override_hybrid": True,
            "workload": {"kind": "probe", "prefix_tokens": 1500, "evict_prefixes": 2, "repetitions": 1},
        }
    )
    assert exp["state"] == "failed"
    assert "arm B (hyb-off8) did not come up" in exp["message"] and "rolled_back" in exp["message"]
    assert "previous profile" in exp["message"]
    runs = exp["runs"]
    assert [r["state"] for r in runs] == ["done", "failed", "pending", "pending"]
    ip = client.get(f"/api/v1/instances/{rig.instance_id()}/profile").json()
    assert ip["current"]["name"] == "hyb-base"
    assert httpx.get(rig.url + "/health", timeout=5).status_code == 200
    page = client.get(f"/experiments/{exp['id']}").text
    assert "did not come up" in page
