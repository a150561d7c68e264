"""`kvscope up` follows the server's KV-cache events by default, so the sizing page of a rig started
the README's way fills like the demo's; `--kv-events off` leaves them alone. (Measured before: a
simulated server publishing events, watched by `kvscope up`, 160 requests: 0 points.)"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ports import free_port
from tests.waits import wait_until

KVSCOPE = [sys.executable, "-m", "kvscope"]
BASE = ["--profile", "rtx4070-qwen3-4b", "--kv-cache-memory-bytes", "1GiB", "--max-model-len", "4096"]

pytestmark = pytest.mark.slow


def doc_ids(i: int, n: int) -> list[int]:
    return [(i * 100_003 + j * 7_919) % 150_000 for j in range(n)]


def _stop(p: subprocess.Popen[Any], sig: int = signal.SIGINT) -> None:
    if p.poll() is None:
        p.send_signal(sig)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=10)


@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, str, dict[str, str]]]:
    """A simulated server publishing KV events and `kvscope up` watching it (args from the test)."""
    sim_port, ev_port, app_port = free_port(), free_port(), free_port()
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{ev_port}"}
    sim = subprocess.Popen(
        [
            *[*KVSCOPE, "sim", "--port", str(sim_port), *BASE, "--sim-state-dir", str(tmp_path / "sim")],
            *["--kv-events-config", json.dumps(events), "--uvicorn-log-level", "warning"],
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sim_url = f"http://127.0.0.1:{sim_port}"
    data = tmp_path / "data"
    up = subprocess.Popen(
        [
            *[*KVSCOPE, "up", "--vllm-url", sim_url, "--data-dir", str(data), "--port", str(app_port)],
            *["--no-gpu", "--interval", "0.5s", *request.param],
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_until(lambda: httpx.get(sim_url + "/health", timeout=2).status_code == 200, "kvscope sim", timeout=60)
        wait_until(lambda: (data / "api-token").exists(), "kvscope up's token", timeout=60)
        auth = {"Authorization": "Bearer " + (data / "api-token").read_text().strip()}
        yield sim_url, f"http://127.0.0.1:{app_port}", auth
    finally:
        _stop(up)
        _stop(sim, signal.SIGTERM)


def _traffic(sim_url: str) -> None:
    """A dozen 1,500-token documents, Zipf popularity, 160 requests: the GPU pool overflows."""
    rng = random.Random(5)
    docs = [doc_ids(i, 1500) for i in range(12)]
    weights = [1 / (i + 1) for i in range(12)]
    with httpx.Client(timeout=30) as c:
        model = c.get(sim_url + "/v1/models").json()["data"][0]["id"]
        for n in range(160):
            ids = docs[rng.choices(range(12), weights=weights)[0]] + doc_ids(1000 + n, 20)
            c.post(
                sim_url + "/v1/completions", json={"model": model, "prompt": ids, "max_tokens": 2}
            ).raise_for_status()


def _instance_id(app_url: str, auth: dict[str, str]) -> int:
    def found() -> Any:
        inst = httpx.get(app_url + "/api/v1/instances", headers=auth, timeout=5).json()["instances"]
        return inst[0]["id"] if inst and inst[0]["last_ok"] else None

    return int(wait_until(found, "the agent's first push", timeout=60))


def _sizes(app_url: str, auth: dict[str, str], iid: int) -> list[Any]:
    rep = httpx.get(f"{app_url}/api/v1/instances/{iid}/sizing", headers=auth, timeout=10).json()
    return [p for p in rep.get("sizes") or [] if p.get("reload_tokens")]


@pytest.mark.parametrize("rig", [[]], indirect=True)
def test_up_fills_the_sizing_curve_from_the_servers_kv_events(rig: tuple[str, str, dict[str, str]]) -> None:
    sim_url, app_url, auth = rig
    iid = _instance_id(app_url, auth)
    _traffic(sim_url)
    sizes = wait_until(lambda: (s := _sizes(app_url, auth, iid)) and len(s) >= 5 and s, "a sizing curve", timeout=60)
    assert len(sizes) >= 5


@pytest.mark.parametrize("rig", [["--kv-events", "off"]], indirect=True)
def test_up_with_kv_events_off_does_not_subscribe(rig: tuple[str, str, dict[str, str]]) -> None:
    sim_url, app_url, auth = rig
    iid = _instance_id(app_url, auth)
    _traffic(sim_url)
    # the instance pushes on (its counters grow) but no window ever arrives
    wait_until(
        lambda: httpx.get(f"{app_url}/api/v1/instances", headers=auth, timeout=5).json()["instances"][0]["last_ok"],
        "pushes after the traffic",
        timeout=30,
    )
    assert _sizes(app_url, auth, iid) == []
