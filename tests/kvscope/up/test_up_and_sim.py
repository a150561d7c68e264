"""End to end: `kvscope up` (app + agent in one command) and `kvscope sim` -> agent -> app."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.host_sources import HostCollector
from agent.hostmem import HostMemorySource
from agent.loop import Agent, AgentConfig
from app.derived.series_reader import SeriesQuery, read_series
from app.storage.series_store import list_instances
from tests.agent.fakevllm import FakeVllm, ServedFake
from tests.agent.livesrv import LiveServer
from tests.ports import free_port
from tests.waits import wait_until

KVSCOPE = [sys.executable, "-m", "kvscope"]


def _wait(pred: Any, timeout: float = 60.0, what: str = "") -> Any:
    return wait_until(pred, what, timeout=timeout, interval=0.2)


def _stop(p: subprocess.Popen[str], sig: int = signal.SIGINT) -> int:
    if p.poll() is None:
        p.send_signal(sig)
    try:
        return p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=10)
        raise


@pytest.mark.slow
def test_up_serves_app_and_agent_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with ServedFake(FakeVllm()) as fake:
        p = subprocess.Popen(
            [
                *KVSCOPE,
                "up",
                "--vllm-url",
                fake.url,
                "--data-dir",
                str(tmp_path / "data"),
                "--port",
                str(port),
                "--no-gpu",
                "--interval",
                "0.2s",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        try:
            assert p.stdout is not None
            first = p.stdout.readline()
            assert f"http://127.0.0.1:{port}" in first, first
            url = f"http://127.0.0.1:{port}/api/v1/instances"

            def ok_instance() -> Any:
                token_file = tmp_path / "data" / "api-token"
                auth = {"Authorization": "Bearer " + token_file.read_text().strip()} if token_file.exists() else {}
                inst = httpx.get(url, timeout=5, headers=auth).json()["instances"]
                return inst if inst and inst[0]["last_ok"] else None

            [inst] = _wait(ok_instance, what="the agent's first push")
            assert inst["url"] == fake.url and inst["model"] == "tiny"
        finally:
            rc = _stop(p)
        out = p.stdout.read() if p.stdout else ""
    assert rc == 0, out
    assert "stopped" in out
    from app.storage.engine import open_database
    from app.storage.tokens import list_tokens

    eng = open_database(f"sqlite:///{tmp_path / 'data' / 'kvscope.db'}")
    try:
        active = [t for t in list_tokens(eng) if not t["revoked_at"]]
        agents = [t for t in active if t["role"] == "agent"]
        assert len(agents) == 1 and str(agents[0]["name"]).startswith("kvscope-up-")
        assert agents[0]["host"] == socket.gethostname()  # bound to the host its agent reports
        assert [t["role"] for t in active if t not in agents] == ["operator"]  # the local CLI's token
    finally:
        eng.dispose()


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port = free_port()
    shm = tmp_path / "shm"
    shm.mkdir()
    p = subprocess.Popen(
        [
            *KVSCOPE,
            "sim",
            "--port",
            str(port),
            "--kv-offloading-size",
            "1",
            "--sim-shm-dir",
            str(shm),
            "--uvicorn-log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: p.poll() is None and httpx.get(url + "/health", timeout=2).status_code == 200, what="kvscope sim")
        yield url, shm
    finally:
        _stop(p, signal.SIGTERM)


@pytest.mark.slow
def test_sim_to_agent_to_app(
    sim: tuple[str, Path], app: Any, token: str, engine: Any, clock: Any, tmp_path: Path
) -> None:
    url, shm = sim
    live = LiveServer(app)
    live.start()
    vllm_client = httpx.Client(trust_env=False)
    push = httpx.Client(trust_env=False)
    agent = Agent(
        AgentConfig([url], server=live.url, token=token, state_dir=tmp_path / "state", host_name="rig1"),
        client=vllm_client,
        push_client=push,
        host=HostCollector([HostMemorySource(shm_root=shm)]),
    )
    t0 = clock() - 30
    try:
        agent.tick(t0)
        prompt = "the same long shared prefix " * 60
        for i in range(3):
            r = vllm_client.post(
                url + "/v1/completions",
                timeout=30,
                json={"model": agent.readers[0].meta.model, "prompt": prompt + str(i), "max_tokens": 4},
            )
            assert r.status_code == 200, r.text
        agent.tick(t0 + 1)
        res = agent.flush(t0 + 1)
        assert res.pushed == 2 and res.error is None
    finally:
        agent.close()
        push.close()
        vllm_client.close()
        live.stop()
    [inst] = list_instances(engine)
    assert inst["simulated"] is True and inst["url"] == url
    assert inst["cache_config"].get("kv_offloading_size") not in (None, "None")
    [pt] = read_series(engine, SeriesQuery(["vllm:prompt_tokens_total"], t0 - 1, t0 + 2, instance_id=inst["id"]))
    (_, before), (_, after) = pt.points
    assert after > before  # the three requests' prompt tokens arrived
    by_src = read_series(
        engine, SeriesQuery(["vllm:prompt_tokens_by_source_total"], t0 - 1, t0 + 2, instance_id=inst["id"])
    )
    assert {s.labels["source"] for s in by_src} >= {"local_compute", "local_cache_hit"}
    files = read_series(
        engine, SeriesQuery(["kvscope:pinned_offload_file_bytes"], t0 - 1, t0 + 2, host_id=inst["host_id"])
    )
    assert files and files[0].labels["file"].startswith("vllm_offload_")
