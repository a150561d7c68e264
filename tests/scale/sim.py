"""Start a `kvscope sim` (the simulated vLLM) for a test, wait for /health, always stop it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from tests.waits import wait_until


def sim_command(port: int, work: Path, host: str = "127.0.0.1", extra: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kvscope",
        "sim",
        "--profile",
        "tiny",
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--kv-offloading-size",
        "1",
        "--sim-shm-dir",
        str(work),
        "--sim-state-dir",
        str(work),
        "--sim-time-scale",
        "50",
        "--uvicorn-log-level",
        "warning",
        *extra,
    ]


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    try:
        wait_until(
            lambda: httpx.get(f"{url}/health", timeout=1.0).status_code == 200,
            f"kvscope sim at {url} to become healthy",
            timeout=timeout,
            interval=0.2,
            abort=lambda: None if proc.poll() is None else f"kvscope sim exited with {proc.returncode}",
        )
    except AssertionError as exc:
        raise RuntimeError(str(exc)) from None


@contextlib.contextmanager
def running_sim(port: int, work: Path, extra: Sequence[str] = ()) -> Iterator[str]:
    work.mkdir(parents=True, exist_ok=True)
    log = (work / "sim.log").open("wb")
    proc = subprocess.Popen(
        sim_command(port, work, extra=extra),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
