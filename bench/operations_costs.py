"""What a backup and an upgrade cost on a store of realistic size (the figures in docs/operations.md).

The store: an hour of two instances at the agent's 1 s tick, made of real readings. Two `kvscope
sim` processes (the tiny profile) serve shared-prefix traffic from a thread; an in-process agent
(the real reader, normaliser, host-memory source and wire format) reads both every tick of a
clock that moves 1 s per tick, and the real IngestWriter stores each batch; the rollup job runs
over the hour. Nothing is scaled up or made up: every row is one the app would hold after the hour.

Then, measured on that store:
- `kvscope backup` run as a user runs it (a process: Python start-up, the online backup API,
  integrity check, rename), wall seconds, and the seconds the command itself reports;
- an upgrade from the oldest schema revision to the head: an empty store made at revision 0001,
  the hour's rows copied in (the columns 0001 has), then `upgrade(engine, "head")` timed;
- for scale, the same upgrade of an empty store at 0001.

    python bench/operations_costs.py [--minutes 60] [--instances 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from agent.fetch import StdlibFetcher
from agent.host_sources import HostCollector
from agent.hostmem import HostMemorySource
from agent.loop import Agent, AgentConfig
from app.ingest.parse import parse_batch
from app.storage.engine import make_engine, open_database, script_revisions, upgrade
from app.storage.ingest_store import IngestWriter, count_samples
from app.storage.rollups import run_rollups
from kvcore.wire import batch_to_wire

T0 = 1_780_000_000.0
DOCS = [" ".join(f"manual {d} chapter {i} covers the cache." for i in range(40)) for d in range(8)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sims(n: int, work: Path) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    procs, urls = [], []
    for i in range(n):
        port = _free_port()
        cmd = [sys.executable, "-m", "kvscope", "sim", "--profile", "tiny", "--port", str(port)]
        cmd += ["--served-model-name", "tiny", "--sim-shm-dir", str(work / f"s{i}")]
        cmd += ["--sim-state-dir", str(work / f"s{i}"), "--sim-time-scale", "50", "--uvicorn-log-level", "warning"]
        (work / f"s{i}").mkdir(parents=True)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} never became healthy")
            time.sleep(0.2)
    return procs, urls


def _traffic(urls: list[str], stop: threading.Event) -> None:
    n = 0
    with httpx.Client(trust_env=False, timeout=10) as c:
        while not stop.is_set():
            n += 1
            for url in urls:
                try:
                    c.post(
                        url + "/v1/completions",
                        json={"model": "tiny", "prompt": DOCS[n % len(DOCS)] + f" question {n}?", "max_tokens": 4},
                    )
                except httpx.HTTPError:
                    pass


def build_store(data: Path, minutes: int, instances: int, work: Path) -> dict[str, float]:
    procs, urls = _sims(instances, work)
    stop = threading.Event()
    traffic = threading.Thread(target=_traffic, args=(urls, stop), daemon=True)
    traffic.start()
    engine = open_database(f"sqlite:///{data / 'kvscope.db'}")
    writer = IngestWriter(engine)
    agent = Agent(
        AgentConfig(urls, state_dir=work / "agent", host_name="benchbox"),
        client=StdlibFetcher(),
        host=HostCollector([HostMemorySource()]),
    )
    ticks = minutes * 60
    t = time.monotonic()
    try:
        for i in range(ticks):
            now = T0 + i
            body = json.dumps(batch_to_wire(agent.build_batch(now))).encode()
            writer.write(parse_batch(body, now, max_future_skew_s=300, max_past_age_s=10**9), now)
        run_rollups(
            engine,
            T0 + ticks,
            raw_retention_s=48 * 3600,
            m1_retention_s=30 * 86400,
            h1_retention_s=400 * 86400,
            max_chunks=100_000,
        )
    finally:
        stop.set()
        traffic.join(15)
        agent.close()
        for p in procs:
            p.terminate()
            p.wait(20)
    samples = count_samples(engine)
    engine.dispose()
    with sqlite3.connect(data / "kvscope.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return {"ticks": ticks, "samples": samples, "fill_s": time.monotonic() - t}


def time_backup(data: Path, out: Path) -> tuple[float, str]:
    t = time.monotonic()
    cp = subprocess.run(
        [sys.executable, "-m", "kvscope", "backup", "--data-dir", str(data), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return time.monotonic() - t, cp.stdout.strip()


def _copy_rows(source: Path, target: Path) -> None:
    with sqlite3.connect(target) as conn:
        conn.execute("ATTACH DATABASE ? AS src", (str(source),))
        tables = [r[0] for r in conn.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")]
        for table in tables:
            if table == "alembic_version":
                continue
            mine = [r[1] for r in conn.execute(f"PRAGMA main.table_info({table})")]
            theirs = {r[1] for r in conn.execute(f"PRAGMA src.table_info({table})")}
            cols = ", ".join(c for c in mine if c in theirs)
            if cols:
                conn.execute(f"INSERT INTO main.{table} ({cols}) SELECT {cols} FROM src.{table}")


def time_upgrade(folder: Path, rows_from: Path | None) -> tuple[float, int]:
    folder.mkdir(parents=True)
    db = folder / "kvscope.db"
    oldest = sorted(script_revisions())[0]  # 0001_initial_schema
    engine = make_engine(f"sqlite:///{db}")
    upgrade(engine, oldest)
    engine.dispose()
    if rows_from is not None:
        _copy_rows(rows_from, db)
    engine = make_engine(f"sqlite:///{db}")
    t = time.monotonic()
    upgrade(engine, "head")
    took = time.monotonic() - t
    samples = count_samples(engine)  # the rows really went through the upgrade
    engine.dispose()
    return took, samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=int, default=60)
    ap.add_argument("--instances", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-opcosts-"))
    try:
        data = tmp / "data"
        data.mkdir()
        made = build_store(data, args.minutes, args.instances, tmp / "work")
        size = sum(f.stat().st_size for f in data.glob("kvscope.db*"))
        print(
            f"store: {args.minutes} min of {args.instances} instances, {made['ticks']} batches, "
            f"{made['samples']:,} samples, {size / 1e6:.1f} MB (filled in {made['fill_s']:.0f} s)"
        )
        wall, said = time_backup(data, tmp / "backup.db")
        reported = re.search(r"([0-9.]+) s", said)
        print(f"kvscope backup: {wall:.2f} s wall (the command says: {said})")
        if reported:
            print(f"  of which the copy itself: {float(reported.group(1)):.2f} s")
        full, kept = time_upgrade(tmp / "upgrade-full", data / "kvscope.db")
        empty, _ = time_upgrade(tmp / "upgrade-empty", None)
        print(
            f"upgrade {sorted(script_revisions())[0]} -> head: {full:.2f} s with the store's rows "
            f"({kept:,} samples after it), {empty:.2f} s empty"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.environ.pop("KVSCOPE_DATA_DIR", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
