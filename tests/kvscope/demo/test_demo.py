"""`kvscope demo` end to end: app + agent (controller launcher) + two sims + traffic, then a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ports import free_port
from tests.waits import wait_until

pytestmark = pytest.mark.slow


def _sims_of(data_dir: Path) -> list[int]:
    """PIDs of sims started by this demo (their command line names the demo's state folder)."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if " sim " in cmd and str(data_dir) in cmd:
            pids.append(int(p.name))
    return pids


def test_demo_fills_the_dashboard_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "demo"
    shm_before = {f for f in os.listdir("/dev/shm") if f.startswith("vllm_offload_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvscope",
            "demo",
            "--port",
            str(port),
            "--data-dir",
            str(data),
            "--offload-gib",
            "0.5",
            "--rate",
            "3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def live() -> tuple[dict[str, str], list[dict[str, Any]]] | None:
            if not (data / "api-token").exists():
                raise httpx.HTTPError("no API token written yet")
            auth = {"Authorization": "Bearer " + (data / "api-token").read_text().strip()}
            inst = httpx.get(base + "/api/v1/instances", timeout=2, headers=auth).json()["instances"]
            if len(inst) != 2 or not all(i["state"] == "up" for i in inst):
                return None
            iid = next(i["id"] for i in inst if i["model"] == "qwen3-4b")
            r = httpx.get(
                base + "/api/v1/series",
                timeout=5,
                headers=auth,
                params={
                    "instance": iid,
                    "metric": "vllm:prompt_tokens_total",
                    "start": time.time() - 120,
                    "end": time.time(),
                    "step": 5,
                },
            )
            pts = [p[1] for s in r.json()["series"] for p in s["points"] if p[1]]
            return (auth, inst) if pts else None

        auth, inst = wait_until(
            live,
            "the demo to show two live simulated instances with prompt traffic",
            timeout=150.0,
            interval=1.0,
            abort=lambda: None if proc.poll() is None else f"the demo exited ({proc.returncode})",
        )
        assert all(i["simulated"] for i in inst)
        cfg = {i["model"]: i["cache_config"] for i in inst}
        assert cfg["qwen3-4b"]["kv_offloading_size"] == "0.5"  # the dense server runs with CPU offload
        assert cfg["qwen3.5-4b"]["kv_offloading_size"] == "None"
        page = httpx.get(base + "/", timeout=10, headers=auth)
        assert page.status_code == 200 and "simulated" in page.text.lower()
        assert httpx.get(base + "/api/v1/instances", timeout=10).status_code == 401  # locked without a login
        assert (data / "api-token").stat().st_mode & 0o777 == 0o600
        assert len(_sims_of(data)) == 2
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    assert "stopped" in out and "Traceback" not in out
    assert f"log in once with http://127.0.0.1:{port}/login/once?t=" in out
    assert _sims_of(data) == []  # the agent stopped the servers it supervised
    shm_after = {f for f in os.listdir("/dev/shm") if f.startswith("vllm_offload_")}
    assert shm_after <= shm_before  # the dense sim's pinned-buffer file is gone
