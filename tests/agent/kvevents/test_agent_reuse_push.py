"""The agent carries KV-event windows on its push, end to end into the app; the sim refuses a bad config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from agent.kvevents.decode import decode_message
from agent.kvevents.tier_model import TierModel
from agent.loop import Agent, AgentConfig
from kvcore.protocol import PushBatch, ReuseWindow
from kvcore.wire import batch_to_wire
from tests.agent.kvevents.kvstreams import message, stored_map


def quiet_vllm(req: httpx.Request) -> httpx.Response:
    return httpx.Response(503, text="down")


def agent_with(tmp_path: Path, source) -> Agent:
    client = httpx.Client(transport=httpx.MockTransport(quiet_vllm))
    return Agent(AgentConfig(vllm_urls=["http://v:8000"], state_dir=tmp_path), client, reuse_source=source)


def test_the_push_carries_the_windows_of_the_tick_and_the_wire_form_equals_to_wire(tmp_path):
    model = TierModel("http://v:8000", now=0.0, max_keys=None)
    model.observe(decode_message(message(0, [stored_map([1, 2])])))
    agent = agent_with(tmp_path, lambda now: [w for w in [model.take_window(now)] if w is not None])
    batch = agent.build_batch(5.0)
    assert [(w.instance, w.references, w.end) for w in batch.reuse] == [("http://v:8000", 2, 5.0)]
    from kvcore.protocol import to_wire

    assert batch_to_wire(batch) == to_wire(batch)
    assert "reuse" not in batch_to_wire(agent.build_batch(6.0))  # nothing new: left off the wire


def test_a_failing_window_source_never_costs_the_readings(tmp_path):
    def broken(now: float) -> list[ReuseWindow]:
        raise RuntimeError("subscriber bug")

    batch = agent_with(tmp_path, broken).build_batch(5.0)
    assert batch.reuse == [] and batch.scrapes


def test_the_tick_tells_its_scrapes_to_the_kv_event_side_before_taking_its_windows(tmp_path):
    order: list[str] = []
    seen: list[list[str]] = []
    agent = agent_with(tmp_path, lambda now: order.append("windows") or [])
    agent.scrapes_seen = lambda scrapes: (order.append("scrapes"), seen.append([s.instance for s in scrapes]))
    agent.build_batch(5.0)
    assert order == ["scrapes", "windows"] and seen == [["http://v:8000"]]


def test_pushed_windows_reach_the_app(client, token, batch_factory, clock, tmp_path):
    now = clock()
    model = TierModel("http://127.0.0.1:8000", now=now - 1, max_keys=None)
    model.observe(decode_message(message(0, [stored_map([1, 2, 3])])))
    body = batch_factory(1, now)
    body["reuse"] = [batch_to_wire_window(model.take_window(now))]
    r = client.post("/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    rep = client.get(f"/api/v1/instances/{iid}/sizing").json()
    assert rep["lookup_tokens"] == 3 * 16 and rep["first_seen_tokens"] == 3 * 16


def batch_to_wire_window(w: ReuseWindow | None) -> dict:
    """One window as the agent's fast wire writer puts it on a push."""
    assert w is not None
    return batch_to_wire(PushBatch(agent_id="a", host="rig1", seq=1, sent_at=w.end, reuse=[w]))["reuse"][0]


def test_the_simulator_refuses_a_bad_kv_events_config_at_start_like_vllm(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvscope",
            "sim",
            "--port",
            "0",
            "--sim-state-dir",
            str(tmp_path),
            "--kv-events-config",
            json.dumps({"enable_kv_cache_events": True, "publisher": "kafka"}),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1, p.stderr
    assert "Unknown event publisher 'kafka'" in p.stderr
