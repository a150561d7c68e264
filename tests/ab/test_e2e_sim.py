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

import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.controller import Controller, load_config
from agent.loop import Agent, AgentConfig
from agent.preflight import GIB
from tests.conftest import api_token
from tests.ports import free_port

pytestmark = pytest.mark.slow
BOX = Path(__file__).resolve().parent.parent / "controller" / "fixtures" / "hosts" / "box32g-cgv2"
KVSCOPE = str(Path(sys.executable).parent / "kvscope")
LAPTOP_POOL = {"kv_cache_memory_bytes": 268435456, "max_model_len": 2048}


class Rig:
    def __init__(self, app: Any, client: Any, agent: Agent, url: str) -> None:
        self.app, self.client, self.agent, self.url = app, client, agent, url

    def step(self) -> None:
        now = time.time()
        self.agent.tick(now)
        self.agent.flush(now)

    def instance_id(self) -> int:
        for _ in range(100):
            self.step()
            insts = [i for i in self.client.get("/api/v1/instances").json()["instances"] if i["url"] == self.url]
            if insts and insts[0].get("cache_config"):
                return int(insts[0]["id"])
            time.sleep(0.1)
        raise AssertionError("the sim never showed up in the app")

    def apply(self, profile: str) -> dict[str, Any]:
        r = self.client.post("/api/v1/rollouts", json={"instance": self.instance_id(), "profile": profile})
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
        for _ in range(1200):  # a bound on real processes, not a timing assertion
            self.step()
            got = dict(self.client.get(f"/api/v1/rollouts/{rid}").json())
            if got["terminal"]:
                return got
            time.sleep(0.1)
        raise AssertionError(f"rollout {rid} did not finish")

    def experiment(self, body: dict[str, Any], max_steps: int = 3000) -> dict[str, Any]:
        from app.ab_api import tick_job

        r = self.client.post("/api/v1/experiments", json={"instance": self.instance_id(), **body})
        assert r.status_code == 201, r.text
        eid = r.json()["id"]
        ctx = self.app.state.ctx
        for _ in range(max_steps):
            tick_job(ctx, time.time())
            self.step()
            exp = dict(self.client.get(f"/api/v1/experiments/{eid}").json())
            if exp["finished"]:
                return exp
            time.sleep(0.1)
        raise AssertionError(f"experiment {eid} did not finish: {exp['state']} {exp['message']}")


@pytest.fixture
def rig_factory(tmp_path: Path, settings: Any, engine: Any) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.storage.tokens import create_token

    settings.probe_request_timeout_s = 4.0
    settings.rollout_health_deadline_s = 60.0
    settings.probe_evict_count = 4
    settings.probe_prefix_words = 1400
    settings.ab_bootstrap_resamples = 500
    app = create_app(settings, engine=engine, clock=time.time, start_jobs=False)
    token = create_token(engine, "e2e", time.time(), host=socket.gethostname())  # the agents' default host name
    shm = Path("/dev/shm") / f"kvscope-ab-e2e-{tmp_path.name}"
    made: list[Agent] = []
    client_cm = TestClient(app)
    client = client_cm.__enter__()
    client.headers["Authorization"] = "Bearer " + api_token(engine)

    def make(sim_args: list[str], initial_args: list[str]) -> Rig:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [KVSCOPE, "sim", "--port", str(port), "--sim-shm-dir", str(shm), "--sim-time-scale", "5", *sim_args]
        cfg = tmp_path / f"launch-{port}.toml"
        cfg.write_text(
            f'state_dir = "{tmp_path / "ctl"}"\n[[instance]]\nurl = "{url}"\ncommand = {cmd!r}\n'
            f"initial_args = {initial_args!r}\nhealth_deadline_s = 60\n"
            f'proc_root = "{BOX / "proc"}"\ncgroup_root = "{BOX / "sys" / "fs" / "cgroup"}"\n'
            '[instance.env]\nVLLM_SERVER_DEV_MODE = "1"\n'.replace("'", '"')
        )
        insts, _ = load_config(cfg)
        ctl = Controller(insts, shm_free=lambda _p: 16 * GIB)
        ctl.start_instances()
        ctl.start_worker()
        agent = Agent(
            AgentConfig(vllm_urls=[url], server="http://testserver", token=token, state_dir=tmp_path / f"agent-{port}"),
            client=httpx.Client(),
            sink=ctl,
            push_client=client,
        )
        made.append(agent)
        health = insts[0].launcher.wait_healthy(url, 60)  # type: ignore[attr-defined]
        assert health.ok, health.reason
        return Rig(app, client, agent, url)

    try:
        yield make, client
    finally:
        ab = app.state.ctx.extras.get("ab")
        if ab is not None:
            ab.executor.shutdown()
        for agent in made:
            agent.close()  # closes the sink: stops the supervised sims
        client_cm.__exit__(None, None, None)
        shutil.rmtree(shm, ignore_errors=True)


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
