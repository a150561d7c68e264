"""Bytes per raw sample in the store against a real Prometheus TSDB, on the same recorded scrapes.

The scrapes: `kvscope demo`'s two servers (the simulator's engine model with the demo's flags and
profiles, driven by the demo's request mix at its default 2 requests/s per server) scraped once a
second by the agent's own reader (agent.vllm_reader: parse, normalise, counter hygiene), in
simulated time: the engine is advanced second by second, no wall-clock waits. One scrape costs
~50 ms here (the exposition render and parse), so `--model-seconds` (default 30 min) of the model
are run and repeated to `--hours` (default 24): counters go on growing from where the last repeat
ended, gauges repeat; timestamps get the agent's few ms of jitter. The same statistics as a real
demo (390 series, 57 % of the samples repeat the previous value; issue 28 measured 57 %). The
scrapes can be kept in a file (--cache) and reused by a later run (the same scrapes for a run on
another commit).

Then, in the same run:
- the store: `kvscope serve` (a real uvicorn process, scheduler off as in bench/ingest.py: the
  hours of scrapes arrive in minutes, and the sealing job would meanwhile encode what real time
  spreads over those hours) with a fresh SQLite database; the batches are pushed through the
  ingest API (20 scrapes a batch, one agent token) as fast as it takes them: ingest samples/s
  (the server's answer time). Then the app's sealing job (timed: sealed samples/s) and rollup
  job run to the end, and the bytes of the raw store (head table, chunk tables and their index,
  SQLite's dbstat) are divided by the samples it holds.
- Prometheus: the same samples (with instance/job target labels) backfilled with `promtool tsdb
  create-blocks-from openmetrics` (tests/scale/prom.py, as bench/query_backends.py does); its
  bytes are every file of the blocks it wrote (chunks, index, meta), over the same samples.
- the 30-day chart: GET /instances/{id}/fragments/chart/tokens?range=30d of the store, through the
  app in-process with a viewer token, median of 5 after one warm-up.

Last line:
    storage: X bytes/sample (Prometheus Y bytes/sample, ratio X/Y), ingest N samples/s, 30-day chart M ms

    python bench/storage.py [--hours 24] [--cache FILE] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

INTERVAL = 1.0
PER_BATCH = 10  # scrapes of each server per push
HOST = "demo-host"


def _server_handler(engine: Any, registry: Any, model: str) -> Any:
    from simulator.metrics import render

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/metrics":
            return httpx.Response(200, content=render(registry), headers={"content-type": "text/plain"})
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/models":
            body = {"data": [{"id": model, "root": model, "max_model_len": engine.cfg.max_model_len}]}
            return httpx.Response(200, json=body)
        if path == "/version":
            return httpx.Response(200, json={"version": "0.11.0"})
        return httpx.Response(404)

    return handle


def record_model(seconds: int, t0: float) -> list[list[dict[str, Any]]]:
    """Per server, its scrapes (wire form) once a second for `seconds` of simulated time."""
    from agent.vllm_reader import VllmReader
    from kvscope.demo import SERVERS, initial_argv, sim_flags
    from kvscope.traffic import Mix, Traffic
    from simulator.config import build_config, make_parser
    from simulator.engine import Engine
    from simulator.metrics import build_registry
    from simulator.tokenizer import encode

    out: list[list[dict[str, Any]]] = []
    rid = 0
    for i, srv in enumerate(SERVERS):
        cfg = build_config(make_parser().parse_args([*sim_flags(srv), *initial_argv(srv.key, 2.0)]))
        eng = Engine(cfg, t0, wall_time=t0, noise_key=f"bench-storage-{i}")
        registry = build_registry(eng)
        url = f"http://127.0.0.1:{8100 + i}"
        client = httpx.Client(transport=httpx.MockTransport(_server_handler(eng, registry, srv.model)), base_url=url)
        mix = Mix(documents=8, document_words=1600) if srv.key == "dense" else Mix()
        traffic = Traffic(url, srv.model, mix=mix, rate=2.0, seed=i)
        reader = VllmReader(url, client)
        rng = random.Random(100 + i)
        scrapes: list[dict[str, Any]] = []
        at = t0 + rng.expovariate(traffic.rate)
        for k in range(seconds):
            t = t0 + (k + 1) * INTERVAL
            while at < t:  # Poisson arrivals at the traffic's rate
                _, prompt = traffic.next_prompt()
                rid += 1
                eng.submit(f"r{rid}", encode(prompt)[: cfg.max_model_len - mix.max_tokens - 1], mix.max_tokens, at)
                at += rng.expovariate(traffic.rate)
            for ev in [*eng.advance(t), *eng._pending_events]:
                if ev.kind in ("finished", "failed"):
                    eng.forget(ev.request_id)
            eng._pending_events = []
            scrape, _events = reader.scrape(t)
            scrapes.append(_scrape(scrape))
        out.append(scrapes)
    return out


def _growth(model: list[list[dict[str, Any]]]) -> list[dict[tuple[str, str], float]]:
    """Per server and counter: how much it grows over one repeat (last - first + one step)."""
    from app.storage.ingest_store import sample_kind

    out: list[dict[tuple[str, str], float]] = []
    for scrapes in model:
        first, last, step = scrapes[0], scrapes[-1], scrapes[min(1, len(scrapes) - 1)]
        g: dict[tuple[str, str], float] = {}
        for s0, s1, sl in zip(first["samples"], step["samples"], last["samples"], strict=False):
            if sample_kind(s0["name"], first["types"]) == "counter":
                key = (s0["name"], json.dumps(s0["labels"], sort_keys=True))
                g[key] = sl["value"] - s0["value"] + (s1["value"] - s0["value"])
        out.append(g)
    return out


def batches(
    model: list[list[dict[str, Any]]], hours: float, end: float, jitter_ms: float = 5.0
) -> Iterator[dict[str, Any]]:
    """Wire batches of the servers scraped every INTERVAL s for `hours`, ending at `end`: the
    model's scrapes repeated (counters continue from where the previous repeat ended, so they only
    grow; gauges repeat), timestamps with the agent's few ms of jitter. Made as they are pushed."""
    n = int(hours * 3600 / INTERVAL)
    t0 = end - n * INTERVAL
    m = len(model[0])
    growth = _growth(model)
    jitter = random.Random(7)
    pending: list[dict[str, Any]] = []
    seq = 0
    for k in range(n):
        rep, r = divmod(k, m)
        t = t0 + (k + 1) * INTERVAL
        for i, scrapes in enumerate(model):
            sc = scrapes[r]
            g = growth[i]
            samples = sc["samples"]
            if rep:
                samples = [
                    {**s, "value": s["value"] + rep * g[key]}
                    if (key := (s["name"], json.dumps(s["labels"], sort_keys=True))) in g
                    else s
                    for s in samples
                ]
            ts = t + jitter.uniform(-jitter_ms, jitter_ms) / 1000 if jitter_ms else t
            pending.append({**sc, "ts": round(ts, 3), "samples": samples})
        if len(pending) >= PER_BATCH * len(model) or k == n - 1:
            seq += 1
            yield {"agent_id": "bench-storage", "host": HOST, "seq": seq, "sent_at": t, "scrapes": pending}
            pending = []


def _scrape(scrape: Any) -> dict[str, Any]:
    from kvcore.wire import _scrape as to_wire  # the agent's own wire form of a scrape

    return to_wire(scrape)


def load_or_record(cache: str | None, model_s: int) -> list[list[dict[str, Any]]]:
    """The model's scrapes (per server), from `cache` when it holds as many seconds."""
    if cache and Path(cache).exists():
        with gzip.open(cache, "rt") as f:
            got = json.load(f)
        if got["model_s"] == model_s:
            return list(got["model"])
    model = record_model(model_s, 0.0)
    if cache:
        with gzip.open(cache, "wt", compresslevel=1) as f:
            json.dump({"model_s": model_s, "model": model}, f)
    return model


def samples_in(model: list[list[dict[str, Any]]], hours: float) -> int:
    n, m = int(hours * 3600 / INTERVAL), len(model[0])
    per_repeat = [sum(len(scrapes[r]["samples"]) for scrapes in model) for r in range(m)]
    return sum(per_repeat) * (n // m) + sum(per_repeat[: n % m])


def start_server(data: Path) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    from ingest import free_port

    port = free_port()
    env = {**os.environ, "KVSCOPE_DATA_DIR": str(data), "KVSCOPE_RUN_SCHEDULER": "false"}
    server = subprocess.Popen(
        [sys.executable, "-m", "kvscope", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return server, base, env


def push_all(base: str, token: str, batches: Iterator[dict[str, Any]]) -> float:
    """Push every batch through the ingest API; returns samples/s over the whole push: the time
    the server took to answer (making and encoding the next batch is not counted)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    stored = 0
    elapsed = 0.0
    with httpx.Client(timeout=120.0) as client:
        for b in batches:
            body = json.dumps(b).encode()
            t0 = time.perf_counter()
            r = client.post(base + "/api/v1/ingest", content=body, headers=headers)
            elapsed += time.perf_counter() - t0
            if r.status_code != 200:
                raise SystemExit(f"push refused: {r.status_code} {r.text[:300]}")
            stored += int(r.json()["stored_samples"])
    return stored / elapsed


def store_bytes(db: Path) -> tuple[int, int, dict[str, int]]:
    """(bytes of the raw store, samples it holds, bytes per table or index) from the database
    file, by SQLite's dbstat (every page of the table and its indexes; a commit before the chunk
    store has only `samples`)."""
    import sqlite3

    with sqlite3.connect(db) as conn:
        have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        names = [n for n in ("samples", "sample_chunks", "uq_sample_chunks_series_end", "open_chunks") if n in have]
        per = {
            n: int(conn.execute("SELECT SUM(pgsize) FROM dbstat WHERE name = ?", (n,)).fetchone()[0] or 0)
            for n in names
        }
        held = int(conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0])
        for table in ("sample_chunks", "open_chunks"):
            if table in have:
                held += int(conn.execute(f"SELECT COALESCE(SUM(n), 0) FROM {table}").fetchone()[0])
    return sum(per.values()), held, per


def prometheus_bytes(make: Callable[[], Iterator[dict[str, Any]]], work: Path) -> tuple[int, int] | None:
    from tests.scale.prom import backfill, binaries, openmetrics

    bins = binaries()
    if bins is None:
        return None

    def samples() -> Any:
        for b in make():
            for sc in b["scrapes"]:
                target = {"instance": sc["instance"].split("//", 1)[1], "job": "vllm"}
                ts = round(sc["ts"] * 1000) / 1000
                for s in sc["samples"]:
                    yield s["name"], {**s["labels"], **target}, s["value"], ts

    storage = work / "prom-data"
    shutil.rmtree(storage, ignore_errors=True)
    storage.mkdir(parents=True)
    # one promtool run per 2 h block (Prometheus's block span, aligned as it aligns them): the
    # samples come in time order, so memory holds one block's worth
    block_s = 7200
    pending: list[tuple[str, dict[str, str], float, float]] = []
    count = 0
    for smp in samples():
        if pending and int(smp[3] // block_s) != int(pending[-1][3] // block_s):
            backfill(bins[1], openmetrics(pending), storage, work)
            pending = []
        pending.append(smp)
        count += 1
    if pending:
        backfill(bins[1], openmetrics(pending), storage, work)
    total = sum(p.stat().st_size for p in storage.rglob("*") if p.is_file())
    return total, count


def chart_ms(data: Path, now: float) -> float:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings
    from app.storage.engine import open_database
    from app.storage.series_store import list_instances
    from app.storage.tokens import create_token

    settings = load_settings(None, data_dir=str(data), run_scheduler=False, chart_cache_s=0.0)
    engine = open_database(settings.effective_database_url)
    app = create_app(settings, engine=engine, clock=lambda: now, start_jobs=False)
    token = create_token(engine, f"bench-storage-{secrets.token_hex(4)}", time.time(), role="viewer")
    inst = list_instances(engine)[0]["id"]
    times = []
    with TestClient(app, base_url="http://127.0.0.1") as client:
        client.headers["Authorization"] = f"Bearer {token}"
        url = f"/instances/{inst}/fragments/chart/tokens?range=30d"
        assert client.get(url).status_code == 200
        for _ in range(5):
            t = time.perf_counter()
            r = client.get(url)
            times.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, r.text[:300]
    engine.dispose()
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument(
        "--model-seconds",
        type=int,
        default=1800,
        help="seconds of the simulated servers actually run (then repeated to --hours; default 1800)",
    )
    ap.add_argument(
        "--jitter-ms", type=float, default=5.0, help="scrape timestamps +- this (the agent's are; default 5)"
    )
    ap.add_argument("--cache", help="keep the recorded scrapes in this file (.json.gz) and reuse them")
    ap.add_argument("--keep", help="keep the work folder (database, Prometheus blocks) here")
    args = ap.parse_args()

    from client_tokens import api_tokens, cli_token

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvscope-bench-storage-"))
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    model = load_or_record(args.cache, args.model_seconds)
    n = samples_in(model, args.hours)
    n_series = sum(len(scrapes[0]["samples"]) for scrapes in model)
    end = math.floor(time.time() / 60) * 60.0 - 60

    def make() -> Iterator[dict[str, Any]]:
        return batches(model, args.hours, end, args.jitter_ms)

    print(
        f"scrapes: {args.hours:g} h of the demo's 2 servers at 1 Hz, {n_series} series, {n:,} samples "
        f"({time.perf_counter() - t:.0f} s to record or load)",
        flush=True,
    )
    data = work / "store"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    server, base, env = start_server(data)
    try:
        admin = cli_token("bench-admin", role="admin", env=env)
        [token] = api_tokens(base, admin, [(HOST, "agent", None)])
        rate = push_all(base, token, make())
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(f"store: ingest through the API {rate:,.0f} samples/s", flush=True)
    now = end + 1
    from app.storage.engine import open_database

    engine = open_database(f"sqlite:///{data / 'kvscope.db'}")
    try:
        from app.storage.chunk_seal import seal_head
    except ImportError:  # a commit before the chunk store: the raw table is the store
        seal_head = None
    from app.storage.rollups import run_rollups

    if seal_head is not None:
        t = time.perf_counter()
        rep = seal_head(engine, now)
        took = time.perf_counter() - t
        print(
            f"store: sealed {rep.samples:,} samples into {rep.chunks_sealed:,} chunks in {took:.1f} s "
            f"({rep.samples / took:,.0f} samples/s)",
            flush=True,
        )
    run_rollups(engine, now, raw_retention_s=48 * 3600, m1_retention_s=30 * 86400, h1_retention_s=400 * 86400)
    engine.dispose()
    raw, held, per = store_bytes(data / "kvscope.db")
    print(f"store: {held:,} raw samples in {raw:,} bytes ({', '.join(f'{k} {v:,}' for k, v in per.items())})")
    ms = chart_ms(data, now)
    print(f"store: 30-day chart (tokens) {ms:.1f} ms median", flush=True)
    prom = prometheus_bytes(make, work)
    mine = raw / held
    if prom is None:
        print("!! promtool missing (scripts/setup.d/45-prometheus.sh): no Prometheus figure")
        print(
            f"storage: {mine:.2f} bytes/sample (Prometheus n/a), ingest {rate:,.0f} samples/s, 30-day chart {ms:.0f} ms"
        )
        return 1
    pbytes, psamples = prom
    theirs = pbytes / psamples
    print(f"Prometheus: {psamples:,} samples in {pbytes:,} bytes of TSDB blocks")
    print(
        f"storage: {mine:.2f} bytes/sample (Prometheus {theirs:.2f} bytes/sample, ratio {mine / theirs:.2f}), "
        f"ingest {rate:,.0f} samples/s, 30-day chart {ms:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
