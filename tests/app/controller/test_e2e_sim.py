"""End to end: app <- agent (real loop pieces) -> controller -> `kvscope sim` under the subprocess launcher.

The app runs in-process; the agent ticks and pushes to it; rollouts requested over the API are
handed out on the push reply, run by the controller's worker thread against a real simulator
process, and reported back. Host memory comes from a recorded tree (32 GB box, 20 GiB available,
16 GiB cgroup limit) so the preflight numbers do not depend on this machine. Small GPU pools
(--num-gpu-blocks-override) keep the probe's evictions, and the RAM the simulated offload buffer
touches, small.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e_rig import e2e_rig

pytestmark = pytest.mark.slow


@pytest.fixture
def rig_factory(tmp_path: Path, settings: Any, engine: Any) -> Iterator[Any]:
    with e2e_rig(tmp_path, settings, engine, time_scale=20) as made:
        yield made


def _profile(client: Any, name: str, spec: dict[str, Any]) -> None:
    r = client.post("/api/v1/profiles", json={"name": name, "spec": spec})
    assert r.status_code == 201, r.text


def test_dense_fp8_pool_then_offload_reload_then_oversize(rig_factory: Any) -> None:
    make, client = rig_factory
    rig = make(["--profile", "rtx4070-qwen3-4b"])
    _profile(client, "fp8", {"kv_cache_dtype": "fp8"})
    _profile(
        client,
        "off8",
        {"offload_size_gib": 8, "max_model_len": 2048, "extra_args": ["--num-gpu-blocks-override", "128"]},
    )
    _profile(client, "off64", {"offload_size_gib": 64})

    # 1) fp8 KV cache: the pool grows ~1.8x (field: 1.82x on an RTX 4070; the sim and a real CPU vLLM
    #    give exactly 2x, bytes per token halved), and the rollout page shows it.
    r = rig.apply("fp8", probe={"prefix_words": 300, "evict_count": 2})
    assert r["state"] == "healthy", r["message"]
    assert r["pool"]["before_tokens"] and r["pool"]["now_tokens"]
    assert 1.7 <= r["pool"]["ratio"] <= 2.05, r["pool"]
    page = client.get(f"/rollouts/{r['id']}").text
    assert f"{r['pool']['ratio']}x" in page and str(r["pool"]["now_tokens"]) in page

    # 2) 8 GiB CPU offload: healthy, verified by a reload that came back as external_kv_transfer.
    r = rig.apply("off8", probe={"prefix_words": 500, "evict_count": 6})
    assert r["state"] == "healthy", r["message"]
    probe = r["result"]["probe"]
    assert probe["ok"] and probe["reload_source"] == "external_kv_transfer"
    reload = probe["steps"][-1]
    assert reload["name"] == "reload" and reload["deltas"]["external_kv_transfer"] > 0
    assert set(probe["ttft_s"]) == {"cold", "gpu_hit", "reload"}
    pre = {c["name"]: c for c in r["result"]["preflight"]}
    assert pre["pinned_vs_memavailable"]["status"] == "pass" and pre["hybrid_model"]["status"] == "pass"
    assert pre["accepted_flags"]["status"] == "pass"  # from `kvscope sim --help`

    # 3) 64 GiB: refused by preflight with the numbers; nothing restarted.
    r = rig.apply("off64")
    assert r["state"] == "refused"
    assert "64.00 GiB" in r["message"] and "MemAvailable 20.00 GiB" in r["message"]
    assert [t["state"] for t in r["result"]["transitions"]] == ["accepted", "preflight", "refused"]
    ip = client.get(f"/api/v1/instances/{rig.instance_id()}/profile").json()
    assert ip["current"]["name"] == "off8" and ip["lkg"]["name"] == "off8"
    # Every transition is an event row on the instance.
    evs = client.get(f"/api/v1/events?instance={rig.instance_id()}").json()["events"]
    assert sum(1 for e in evs if e["kind"] == "rollout") >= 15


@pytest.mark.parametrize("failure", ["crash", "hang"])
def test_hybrid_offload_refused_then_override_rolls_back(rig_factory: Any, failure: str) -> None:
    make, client = rig_factory
    base = ["--num-gpu-blocks-override", "8", "--max-model-len", "4096"]
    rig = make(["--profile", "rtx4070-qwen3.5-4b", "--hybrid-failure", failure], initial_args=base)
    _profile(
        client,
        "hyb-off8",
        {"offload_size_gib": 8, "max_model_len": 4096, "extra_args": ["--num-gpu-blocks-override", "8"]},
    )
    probe = {"prefix_words": 2000, "evict_count": 4}
    r = rig.apply("hyb-off8", probe=probe)
    assert r["state"] == "refused" and "hybrid" in r["message"] and "mamba_cache_mode=align" in r["message"]

    r = rig.apply("hyb-off8", override=True, probe=probe)
    assert r["state"] == "rolled_back", r["message"]
    assert r["result"]["probe"]["failure"] == failure
    states = [t["state"] for t in r["result"]["transitions"]]
    assert states == ["accepted", "preflight", "restarting", "waiting_health", "probing", "rolling_back", "rolled_back"]
    if failure == "hang":
        assert "no answer within 4 s" in r["message"]
    # Back on the last-known-good args, and serving.
    assert r["result"]["argv"] == base
    assert httpx.get(rig.url + "/health", timeout=5).status_code == 200
    ip = client.get(f"/api/v1/instances/{rig.instance_id()}/profile").json()
    assert ip["lkg"] is None  # nothing was verified healthy through the app yet
