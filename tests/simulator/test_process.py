"""`kvscope sim` as a child process: start-up delay, offload buffer file, state file for the fake
nvidia-smi, clean exit on SIGTERM/SIGINT, and the hybrid crash/hang failure modes over real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from simulator.profiles import GIB, MIB
from tests.ports import free_port
from tests.simulator.simdrive import doc_text
from tests.waits import wait_until

KVSCOPE = [sys.executable, "-m", "kvscope", "sim"]


def wait_healthy(p: subprocess.Popen[str], url: str, timeout: float = 30.0) -> None:
    def healthy() -> bool:
        assert p.poll() is None, p.communicate()[1]
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, "kvscope sim to answer /health", timeout)


@contextmanager
def sim(tmp: Path, *argv: str, env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    p = subprocess.Popen(
        [
            *KVSCOPE,
            "--port",
            str(port),
            "--sim-shm-dir",
            str(tmp / "shm"),
            "--sim-state-dir",
            str(tmp / "state"),
            "--uvicorn-log-level",
            "warning",
            *argv,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        yield p, f"http://127.0.0.1:{port}"
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=30)


def stop(p: subprocess.Popen[str], sig: int) -> int:
    p.send_signal(sig)
    return p.wait(timeout=30)


def smi(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "simulator.fake_nvidia_smi", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "KVSCOPE_SIM_STATE_DIR": str(tmp / "state")},
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sim_process_lifecycle(tmp_path: Path, sig: int) -> None:
    with sim(tmp_path, "--profile", "tiny", "--kv-offloading-size", "0.01", "--startup-delay", "1.5") as (p, url):
        # the buffer is allocated at engine start, before the start-up delay
        [buf] = wait_until(lambda: list((tmp_path / "shm").glob("vllm_offload_*.mmap")), "the offload buffer file")
        with pytest.raises(httpx.ConnectError):  # like vLLM: the port opens only once the engine is up
            httpx.get(url + "/health", timeout=1)
        assert buf.stat().st_size == int(0.01 * GIB)
        wait_healthy(p, url)
        # short enough for the 0.01 GiB tier's few chunks: like vLLM 0.32, a request with more new
        # chunks than the tier can make room for stores none of them
        r = httpx.post(url + "/v1/completions", json={"prompt": doc_text(0, 40), "max_tokens": 2}, timeout=10)
        assert r.status_code == 200 and r.headers["x-kvscope-simulated"] == "1"
        assert os.stat(buf).st_blocks > 0  # stored chunks touched their pages: resident, not sparse
        # the state file is rewritten twice a second: wait for one the fake nvidia-smi reads
        [state] = wait_until(lambda: list((tmp_path / "state").glob("sim-*.json")), "the sim's state file")

        def gpu_line() -> list[str] | None:
            q = smi(tmp_path, "--query-gpu=index,name,memory.used,memory.total", "--format=csv,noheader,nounits")
            parts = q.stdout.strip().split(", ")
            return parts if len(parts) == 4 else None

        idx, name, used, total = wait_until(gpu_line, "a GPU line from the fake nvidia-smi")
        assert (idx, name, int(total)) == ("0", "NVIDIA GeForce RTX 4070", 12282)
        assert int(used) == (int(12282 * MIB * 0.9) + 4 * MIB) // MIB  # what the sim reserved (+ driver)
        apps = smi(tmp_path, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        assert apps.stdout.split(", ")[0] == str(p.pid)
        assert stop(p, sig) == 0
    assert not buf.exists() and not state.exists()


def test_bad_flags_and_startup_failures_exit_like_vllm(tmp_path: Path) -> None:
    r = subprocess.run([*KVSCOPE, "--enable-offload"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unrecognized arguments: --enable-offload" in r.stderr
    r = subprocess.run(
        [
            *KVSCOPE,
            "--profile",
            "rtx4070-qwen3.5-4b",
            "--kv-offloading-size",
            "1",
            "--kv-offloading-backend",
            "lmcache",
            "--sim-shm-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "failed to convert the KV cache specs to one unified type" in r.stderr
    assert not list(tmp_path.iterdir())


HYBRID = (
    "--profile",
    "rtx4070-qwen3.5-4b",
    "--num-gpu-blocks-override",
    "2",
    "--max-model-len",
    "1600",
    "--kv-offloading-size",
    "0.15",
    "--sim-time-scale",
    "20",
)


def _evict(url: str) -> None:
    for i in (1, 2):  # doc 2 evicts doc 1 from the 2-block GPU pool; both are stored to the CPU tier
        r = httpx.post(url + "/v1/completions", json={"prompt": doc_text(i, 900), "max_tokens": 2}, timeout=30)
        assert r.status_code == 200


def test_hybrid_reload_crash_gets_500_then_the_process_exits(tmp_path: Path) -> None:
    with sim(tmp_path, *HYBRID, "--hybrid-failure", "crash") as (p, url):
        wait_healthy(p, url)
        _evict(url)
        r = httpx.post(url + "/v1/completions", json={"prompt": doc_text(1, 900), "max_tokens": 2}, timeout=30)
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
        assert p.wait(timeout=30) == 1
        assert "EngineDeadError" in p.communicate()[1]
    assert list((tmp_path / "shm").glob("vllm_offload_*.mmap"))  # a crash leaves the buffer behind


@pytest.mark.slow
def test_hybrid_reload_hang_gives_no_reply(tmp_path: Path) -> None:
    with sim(tmp_path, *HYBRID, "--hybrid-failure", "hang") as (p, url):
        wait_healthy(p, url)
        _evict(url)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json={"prompt": doc_text(1, 900), "max_tokens": 2}, timeout=2)
        assert httpx.get(url + "/health", timeout=5).status_code == 200  # the API server still answers
        first = _lookups(url)
        wait_until(lambda: _lookups(url) > first, "the engine to retry the CPU lookup")  # it keeps retrying
        with pytest.raises(httpx.ReadTimeout):  # and serves nothing else any more
            httpx.post(url + "/v1/completions", json={"prompt": "short", "max_tokens": 1}, timeout=1)
        assert "kv_offload_load_bytes_total{" in httpx.get(url + "/metrics").text
        assert stop(p, signal.SIGTERM) == 0
    assert not list((tmp_path / "shm").glob("vllm_offload_*.mmap"))


def _lookups(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("vllm:kv_offload_lookup_sync_delay_seconds_count{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no lookup histogram")


def test_sigterm_during_startup_delay_exits_cleanly(tmp_path: Path) -> None:
    with sim(tmp_path, "--profile", "tiny", "--kv-offloading-size", "0.01", "--startup-delay", "60") as (p, _url):
        wait_until(lambda: list((tmp_path / "shm").glob("vllm_offload_*.mmap")), "the offload buffer file")
        assert stop(p, signal.SIGTERM) == 0
    assert not list((tmp_path / "shm").glob("vllm_offload_*.mmap"))


def test_agent_nvidia_smi_source_reads_a_running_sim_through_the_fake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.gpu_smi import SmiSource

    fake = Path(sys.executable).parent / "kvscope-fake-nvidia-smi"
    monkeypatch.setenv("KVSCOPE_SIM_STATE_DIR", str(tmp_path / "state"))
    with sim(tmp_path, "--profile", "rtx4070-qwen3-4b", "--kv-offloading-size", "0.05") as (p, url):
        wait_healthy(p, url)
        src = SmiSource(exe=str(fake), interval_s=0.2, apps_every_s=0.0)
        try:
            for i in range(3):  # reload traffic: stores (tx) and, after eviction, loads (rx)
                httpx.post(url + "/v1/completions", json={"prompt": doc_text(i % 2, 1200), "max_tokens": 2}, timeout=10)
            got: dict[str, float] = {}

            def read_both() -> bool:
                got.update({s.name: s.value for s in src.read(time.monotonic()).samples})
                return {"kvscope:gpu_memory_used_bytes", "kvscope:gpu_process_memory_bytes"} <= set(got)

            wait_until(read_both, "GPU and process memory from the fake nvidia-smi", 20, interval=0.3)
        finally:
            src.close()
        assert got["kvscope:gpu_memory_total_bytes"] == 12282 * MIB
        assert got["kvscope:gpu_memory_used_bytes"] == (int(12282 * MIB * 0.9) + 4 * MIB) // MIB * MIB
        assert got["kvscope:gpu_process_memory_bytes"] == int(12282 * MIB * 0.9) // MIB * MIB
        assert got["kvscope:gpu_source_info"] == 1
        stop(p, signal.SIGTERM)
