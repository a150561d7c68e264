"""The dashboard fed by the real pipeline: `kvscope sim` (a simulated GPU vLLM with a CPU offload
tier and a fake nvidia-smi) + `kvscope agent` pushing to the real app, traffic from
kvscope.traffic; then the overview and the instance page in headless Chromium."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import LiveApp
from tests.conftest import api_token
from tests.ports import free_port
from tests.waits import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]
CHARTS = ["tokens", "hitrates", "transfer", "pinned", "tiers", "latency", "gpu"]
FEED_BOUND_S = 120.0  # a bound on a stuck pipeline; the fixture moves on as soon as every chart has data


MIN_POINTS = 5  # per trace before the browser looks: a few seconds of every series, not a first sample


def _filled(traces: list[dict[str, Any]]) -> bool:
    """Every trace but the event markers has MIN_POINTS non-null points (the test asserts one in
    the page, whose grid follows the plot's width: a lone first sample may not land in it)."""
    data = [t for t in traces if t.get("name") != "events"]
    return bool(data) and all(sum(v is not None for v in t.get("y") or []) >= MIN_POINTS for t in data)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _wait(url: str, deadline_s: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    try:
        wait_until(
            lambda: httpx.get(url, timeout=1.0).status_code == 200,
            f"{url} to be up",
            timeout=deadline_s,
            interval=0.2,
            abort=lambda: None if proc.poll() is None else f"the process exited ({proc.returncode})",
        )
    except AssertionError as exc:
        pytest.fail(f"{exc}: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def sim_fed(tmp_path_factory: Any, chromium_context: Any) -> Iterator[tuple[LiveApp, str]]:
    from kvscope.traffic import Traffic

    tmp = tmp_path_factory.mktemp("simfeed")
    shm, state, agent_dir = tmp / "shm", tmp / "sim-state", tmp / "agent"
    for d in (shm, state, agent_dir):
        d.mkdir()
    fake_smi = Path(sys.executable).parent / "kvscope-fake-nvidia-smi"
    if not fake_smi.exists():
        pytest.skip("kvscope-fake-nvidia-smi is not installed (pip install -e .)")
    app = LiveApp(tmp / "app", host="sim-rig")
    app.start()
    app.login(chromium_context)
    procs: list[subprocess.Popen[bytes]] = []
    traffic = None
    try:
        env = {**os.environ, "KVSCOPE_SIM_STATE_DIR": str(state)}
        port = free_port()
        sim_url = f"http://127.0.0.1:{port}"
        sim_log = tmp / "sim.log"
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kvscope",
                    "sim",
                    "--profile",
                    "rtx4070-qwen3-4b",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--served-model-name",
                    "qwen3-4b",
                    "--kv-offloading-size",
                    "0.25",
                    "--kv-offloading-backend",
                    "native",
                    "--sim-shm-dir",
                    str(shm),
                    "--sim-state-dir",
                    str(state),
                    "--max-model-len",
                    "4096",
                    "--num-gpu-blocks-override",
                    "600",
                ],
                env=env,
                stdout=sim_log.open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        _wait(sim_url + "/health", 60, procs[0], sim_log)
        agent_log = tmp / "agent.log"
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kvscope",
                    "agent",
                    "--server",
                    app.url,
                    "--token",
                    app.token,
                    "--vllm-url",
                    sim_url,
                    "--interval",
                    "1",
                    "--state-dir",
                    str(agent_dir),
                    "--gpu-source",
                    "nvidia-smi",
                    "--nvidia-smi",
                    str(fake_smi),
                    "--shm-root",
                    str(shm),
                    "--host-name",
                    "sim-rig",
                    "--log-level",
                    "warning",
                ],
                env=env,
                stdout=agent_log.open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        traffic = Traffic(sim_url, "qwen3-4b", rate=6.0, workers=3, seed=3, max_requests=2000)
        traffic.start()
        auth = {"Authorization": "Bearer " + api_token(app.engine, "viewer")}

        def fed() -> str | None:
            """The instance's id once every chart's JSON has data in each of its traces."""
            if procs[1].poll() is not None:
                pytest.fail(f"agent exited: {agent_log.read_text()[-2000:]}")
            instances = httpx.get(app.url + "/api/v1/instances", headers=auth).json()["instances"]
            if not instances:
                return None
            iid = str(instances[0]["id"])
            for key in CHARTS:
                url = f"{app.url}/api/v1/instances/{iid}/charts/{key}"
                fig = httpx.get(url, headers=auth, params={"range": "15m"}).json()["figure"]
                if not fig or not _filled(fig["data"]):
                    return None
            return iid

        try:
            iid = wait_until(fed, "every chart to have data", timeout=FEED_BOUND_S, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; agent log: {agent_log.read_text()[-2000:]}") from None
        yield app, iid
    finally:
        if traffic is not None:
            traffic.stop()
        for p in reversed(procs):
            _stop(p)
        app.stop()


def test_sim_and_agent_feed_every_chart(sim_fed: tuple[LiveApp, str], page: Any) -> None:
    app, iid = sim_fed
    p, log = page
    p.goto(app.url + "/")
    p.wait_for_selector(".instance-card")
    assert p.locator(".instance-card [data-state]").first.get_attribute("data-state") == "up"
    assert p.locator(".instance-card .badge.sim").count() == 1  # the sim says it is simulated
    p.goto(f"{app.url}/instances/{iid}?range=15m")
    p.wait_for_function(
        "() => document.querySelectorAll('.chart-panel .chart[data-rendered=\"1\"]').length"
        " + document.querySelectorAll('.chart-panel .empty').length === 7",
        timeout=30_000,
    )
    empty = {
        el.get_attribute("data-empty") and el.evaluate("e => e.closest('section').dataset.chart"): el.inner_text()
        for el in p.locator(".chart-panel .empty").all()
    }
    assert not empty, f"charts without data: {empty}"
    for key in CHARTS:
        traces = p.evaluate(
            "(k) => document.querySelector(`#chart-${k} .chart`).data.filter(t => t.name !== 'events')"
            ".map(t => [t.name, t.y.filter(v => v !== null).length])",
            key,
        )
        assert traces and all(n > 0 for _, n in traces), (key, traces)
    assert log.errors == []
