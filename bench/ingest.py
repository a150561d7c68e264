"""Ingest throughput through the real HTTP API into SQLite.

Starts `kvscope serve` (a real uvicorn process) on a loopback port with a fresh data dir, creates
one agent token per host (bench/client_tokens.py: an admin token from `kvscope token create`, the
agent tokens through the admin API), then pushes synthetic batches shaped like 50 hosts x 400
series at 1 Hz from a separate client process (asyncio, bounded count and time) and prints
samples/s sustained.

Baseline, measured in the same run: the same rows written straight into a SQLite file with one
executemany per batch (no HTTP, no JSON, no validation): the storage floor. The ratio says what the
API path costs on top of it. Target: >= 20,000 samples/s through the API.

    python bench/ingest.py [--hosts 50] [--series 400] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from client_tokens import api_tokens, cli_token

TARGET = 20_000.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_batch(host: int, seq: int, ts: float, n_series: int) -> bytes:
    samples = []
    for i in range(n_series):
        name = "vllm:prompt_tokens_by_source_total" if i % 4 == 0 else f"vllm:bench_metric_{i % 97}_total"
        samples.append(
            {
                "name": name,
                "labels": {"model_name": "qwen3-8b", "engine": "0", "idx": str(i)},
                "value": float(seq * (i + 1)),
            }
        )
    batch = {
        "agent_id": f"bench-agent-{host}",
        "host": f"bench-host-{host}",
        "seq": seq,
        "sent_at": ts,
        "scrapes": [
            {
                "instance": f"http://10.0.{host // 250}.{host % 250}:8000",
                "ts": ts,
                "ok": True,
                "types": {"vllm:prompt_tokens_by_source": "counter"},
                "samples": samples,
            }
        ],
    }
    return json.dumps(batch).encode()


async def pusher(
    url: str, token: str, host: int, n_series: int, deadline: float, t0: float, counts: list[int], errors: list[str]
) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=30.0) as client:
        seq = 0
        while time.monotonic() < deadline:
            seq += 1
            body = make_batch(host, seq, t0 + seq, n_series)
            try:
                r = await client.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                errors.append(repr(exc))
                continue
            if r.status_code != 200:
                errors.append(f"{r.status_code} {r.text[:200]}")
                continue
            counts[0] += r.json()["stored_samples"]


def api_run(hosts: int, n_series: int, seconds: float) -> tuple[float, int, list[str]]:
    tmp = tempfile.mkdtemp(prefix="kvscope-bench-")
    port = free_port()
    env = {**os.environ, "KVSCOPE_DATA_DIR": tmp, "KVSCOPE_RUN_SCHEDULER": "false"}
    admin = cli_token("bench-admin", role="admin", env=env)
    server = subprocess.Popen(
        [sys.executable, "-m", "kvscope", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        # an agent token is bound to its host: one per simulated host, as `kvscope token create HOST`
        tokens = api_tokens(base, admin, [(f"bench-host-{h}", "agent", None) for h in range(hosts)])
        counts = [0]
        errors: list[str] = []
        t0 = time.time()

        async def main() -> None:
            # Warm-up: first batch of every host creates its series (not the steady state).
            await asyncio.gather(
                *(
                    pusher(
                        base + "/api/v1/ingest", tokens[h], h, n_series, time.monotonic() + 0.01, t0 - 3600, [0], errors
                    )
                    for h in range(hosts)
                )
            )
            start = time.monotonic()
            deadline = start + seconds
            await asyncio.gather(
                *(
                    pusher(base + "/api/v1/ingest", tokens[h], h, n_series, deadline, t0, counts, errors)
                    for h in range(hosts)
                )
            )
            counts.append(int((time.monotonic() - start) * 1000))

        asyncio.run(main())
        elapsed = counts[1] / 1000.0
        return counts[0] / elapsed, counts[0], errors
    finally:
        server.terminate()
        server.wait(timeout=30)


def baseline_run(hosts: int, n_series: int, seconds: float) -> float:
    """Raw SQLite executemany of the same rows into the same schema shape (WAL, NORMAL)."""
    with tempfile.TemporaryDirectory() as d:
        conn = sqlite3.connect(Path(d) / "b.db")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE samples (series_id INTEGER, ts_ms INTEGER, value REAL, "
            "PRIMARY KEY (series_id, ts_ms)) WITHOUT ROWID"
        )
        n = 0
        start = time.monotonic()
        seq = 0
        while time.monotonic() - start < seconds:
            seq += 1
            for h in range(hosts):
                rows = [(h * n_series + i, seq * 1000, float(seq * i)) for i in range(n_series)]
                with conn:
                    conn.executemany("INSERT OR IGNORE INTO samples VALUES (?, ?, ?)", rows)
                n += n_series
        rate = n / (time.monotonic() - start)
        conn.close()
        return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=50)
    ap.add_argument("--series", type=int, default=400)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    base = baseline_run(args.hosts, args.series, min(args.seconds, 5.0))
    rate, total, errors = api_run(args.hosts, args.series, args.seconds)
    print(f"baseline (raw SQLite executemany): {base:,.0f} samples/s")
    print(f"kvscope HTTP ingest -> SQLite:     {rate:,.0f} samples/s  ({total:,} samples, {len(errors)} errors)")
    print(f"ratio api/baseline: {rate / base:.3f}   ratio api/target({TARGET:,.0f}): {rate / TARGET:.2f}")
    if errors:
        print("first errors:", errors[:3])
    return 0 if rate >= TARGET and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
