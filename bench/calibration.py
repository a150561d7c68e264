"""Calibration bench: the field probes of DOMAIN.md against running `kvscope sim` servers, in real time.

    .venv/bin/python bench/calibration.py            # starts the sims it needs, prints the table
    .venv/bin/python bench/calibration.py --quick    # skips the no-offload dense probe

For every probe it prints the field figure, the wall-clock measured here over HTTP (the way the
field measured: whole non-streaming request with max_tokens=16 for the 4070, streaming time to first
token for the laptop), the model's own figure (`x-kvscope-sim-*` headers) and the ratios
measured/field and measured/model (the latter is the HTTP stack's overhead on this machine). Also a
load probe: 4 concurrent cold prefills vs one alone. Nothing is asserted: this is where wall-clock
belongs; the tests assert on the model.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


def doc(i: int, n: int) -> str:
    return " ".join(f"d{i}w{j}" for j in range(n))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def sim(*argv: str) -> Iterator[str]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvscope",
                "sim",
                "--port",
                str(port),
                "--sim-shm-dir",
                tmp,
                "--sim-state-dir",
                tmp,
                "--uvicorn-log-level",
                "warning",
                *argv,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if p.poll() is not None:
                    raise SystemExit(f"kvscope sim exited: {p.communicate()[1]}")
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.1)
            yield url
        finally:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def whole(c: httpx.Client, prompt: str) -> tuple[float, float]:
    t = time.perf_counter()
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16, "temperature": 0})
    wall = (time.perf_counter() - t) * 1000
    r.raise_for_status()
    return wall, float(r.headers["x-kvscope-sim-e2e-ms"])


def ttft(c: httpx.Client, prompt: str) -> tuple[float, float]:
    t = time.perf_counter()
    with c.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 4, "stream": True}) as r:
        r.raise_for_status()
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                wall = (time.perf_counter() - t) * 1000
                break
        for _ in lines:
            pass
    return wall, float(r.headers["x-kvscope-sim-ttft-ms"])


ROWS: list[tuple[str, float, float, float]] = []


def row(name: str, field: float, measured: tuple[float, float]) -> None:
    ROWS.append((name, field, *measured))
    wall, model = measured
    print(f"{name:<44} {field:>9.1f} {wall:>10.1f} {model:>9.1f} {wall / field:>8.2f} {wall / model:>8.2f}", flush=True)


def dense(quick: bool) -> None:
    with (
        sim("--profile", "rtx4070-qwen3-4b", "--kv-offloading-size", "8") as url,
        httpx.Client(base_url=url, timeout=60) as c,
    ):
        c.post("/v1/completions", json={"prompt": "warm up", "max_tokens": 1})
        a = doc(0, 2890)
        row("4070 dense: cold (whole request)", 602, whole(c, a))
        row("4070 dense: GPU hit", 230, whole(c, a))
        for i in range(1, 17):
            whole(c, doc(i, 2890))
        row("4070 dense: reload from CPU after 16 docs", 254, whole(c, a))
    if quick:
        return
    with sim("--profile", "rtx4070-qwen3-4b") as url, httpx.Client(base_url=url, timeout=60) as c:
        c.post("/v1/completions", json={"prompt": "warm up", "max_tokens": 1})
        whole(c, doc(0, 2890))
        for i in range(1, 17):
            whole(c, doc(i, 2890))
        row("4070 dense, no offload: after 16 docs", 602, whole(c, doc(0, 2890)))


def hybrid() -> None:
    with sim("--profile", "rtx4070-qwen3.5-4b") as url, httpx.Client(base_url=url, timeout=60) as c:
        c.post("/v1/completions", json={"prompt": "warm up", "max_tokens": 1})
        row("4070 hybrid: cold", 2646, whole(c, doc(0, 2500)))
        row("4070 hybrid: GPU hit", 83, whole(c, doc(0, 2500)))


def laptop() -> None:
    base = [
        "--profile",
        "laptop8gb-qwen3-reranker-0.6b",
        "--kv-cache-memory-bytes",
        "268435456",
        "--max-model-len",
        "2048",
    ]
    with sim(*base, "--kv-offloading-size", "0.5") as url, httpx.Client(base_url=url, timeout=60) as c:
        row("laptop reranker: first request (warm-up)", 104, ttft(c, doc(9, 1600)))
        a = doc(0, 1600)
        row("laptop reranker: A cold (streaming TTFT)", 77, ttft(c, a))
        row("laptop reranker: A GPU hit", 14.0, ttft(c, a))
        ttft(c, doc(1, 1500))
        ttft(c, doc(2, 1500))
        row("laptop reranker: A after B, C, reload from CPU", 35, ttft(c, a))
    with sim(*base) as url, httpx.Client(base_url=url, timeout=60) as c:
        ttft(c, doc(9, 10))
        ttft(c, doc(0, 1600))
        ttft(c, doc(1, 1500))
        ttft(c, doc(2, 1500))
        row("laptop reranker, no offload: A after B, C", 77, ttft(c, doc(0, 1600)))


def load() -> None:
    """Queueing: 4 concurrent cold prefills vs one alone (the device's prefill throughput is shared)."""
    with sim("--profile", "rtx4070-qwen3-4b") as url:

        async def go() -> tuple[float, float]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                await c.post("/v1/completions", json={"prompt": "warm up", "max_tokens": 1})
                t = time.perf_counter()
                await c.post("/v1/completions", json={"prompt": doc(100, 3000), "max_tokens": 1})
                alone = time.perf_counter() - t
                t = time.perf_counter()
                await asyncio.gather(
                    *(c.post("/v1/completions", json={"prompt": doc(200 + i, 3000), "max_tokens": 1}) for i in range(4))
                )
                return alone, time.perf_counter() - t

        alone, four = asyncio.run(go())
        print(
            f"\nload: one cold 3,000-token prefill {alone * 1000:.0f} ms; four at once {four * 1000:.0f} ms; "
            f"ratio {four / alone:.2f} (shared prefill: ~4 expected)"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="skip the no-offload dense probe")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print("SIMULATED: every figure below comes from kvscope sim's cost model, served over real HTTP.")
    print(f"{'probe':<44} {'field ms':>9} {'wall ms':>10} {'model ms':>9} {'wall/fld':>8} {'wall/mdl':>8}")
    dense(args.quick)
    hybrid()
    laptop()
    load()
    worst = max(abs(w / f - 1) for _, f, w, _ in ROWS)
    print(f"\nworst |wall/field - 1| = {worst:.3f} (the tests hold the model within 0.15)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
