"""0013_sample_chunks on a database of the previous head with data: the upgrade itself only adds
the chunk tables, the sealing job converts the old raw rows in the background, and a kill -9 in
the middle of that conversion loses and duplicates nothing (each batch is one transaction); the
next run finishes it, and the app reads the same points before, during and after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from app.ingest.parse import parse_batch
from app.storage import chunk_reads
from app.storage.chunk_seal import seal_head
from app.storage.engine import make_engine, open_database, upgrade
from app.storage.ingest_store import IngestWriter
from app.storage.models import SampleChunk, SampleRow, Series
from app.storage.raw_store import raw_points_from
from tests.app.dashboard.recorded import opened_app, recorded_batches
from tests.app.storage.test_upgrades import _copy_rows as copy_rows
from tests.waits import wait_until

T0 = 1_780_000_000.0
PREVIOUS_HEAD = "0012_sessions"
ROOT = Path(__file__).resolve().parents[3]

# the conversion in a process of its own, one series per transaction, until nothing is left
CONVERT = """
import sys
from app.storage.engine import make_engine
from app.storage.chunk_seal import seal_head
engine = make_engine(sys.argv[1])
while seal_head(engine, float(sys.argv[2]), batch=1, max_batches=1).samples:
    pass
"""


def _old_database(db: Path) -> tuple[Engine, list[dict[str, Any]]]:
    # today's ingest writes into a database at the head (it writes columns 0012 did not have:
    # series.write_gen, hosts.write_seq), whose rows are then copied into one at 0012
    pushed = db.with_name("pushed.db")
    head = open_database(f"sqlite:///{pushed}")
    batches = recorded_batches(T0 - 4 * 3600, 1400, interval=10.0, reset_at=600)
    writer = IngestWriter(head)
    for b in batches:
        now = b["sent_at"] + 0.5
        writer.write(parse_batch(json.dumps(b).encode(), now, max_future_skew_s=60, max_past_age_s=1e9), now)
    head.dispose()
    engine = make_engine(f"sqlite:///{db}")
    upgrade(engine, PREVIOUS_HEAD)
    engine.dispose()
    copy_rows(pushed, db)
    return make_engine(f"sqlite:///{db}"), batches


def _all_points(engine: Engine) -> dict[int, list[tuple[float, float]]]:
    with engine.connect() as conn:
        ids = sorted(int(s) for (s,) in conn.execute(select(Series.id)))
    return raw_points_from(engine, dict.fromkeys(ids, T0 - 5 * 3600), T0 + 3600)


def _head_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(SampleRow)).scalar_one())


def test_a_kill_9_in_the_middle_of_converting_the_raw_table_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "kvscope.db"
    engine, batches = _old_database(db)
    with engine.connect() as conn:
        held = int(conn.execute(select(func.count()).select_from(SampleRow)).scalar_one())
    upgrade(engine)  # 0013: the chunk tables; every raw row is still in the head
    assert _head_rows(engine) == held
    want = _all_points(engine)
    assert sum(len(p) for p in want.values()) == held

    now = batches[-1]["sent_at"] + 600
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CONVERT, f"sqlite:///{db}", str(now)], env=env, cwd=ROOT)
    try:
        wait_until(lambda: _head_rows(engine) < held * 0.8, "the conversion to be under way")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    left = _head_rows(engine)
    assert 0 < left < held, "killed in the middle"
    with engine.connect() as conn:
        assert chunk_reads.count(conn) == held  # every sample once: head or chunk, never both or neither
        assert conn.execute(select(func.count()).select_from(SampleChunk)).scalar_one() > 0
    assert _all_points(engine) == want  # what the app reads meanwhile

    rep = seal_head(engine, now)  # the next run goes on where the killed one stopped
    assert rep.samples == left and _head_rows(engine) == 0
    with engine.connect() as conn:
        assert chunk_reads.count(conn) == held
    assert _all_points(engine) == want
    engine.dispose()

    with opened_app(tmp_path, lambda: T0 + 10) as (_app, client):
        [inst] = client.get("/api/v1/instances").json()["instances"]
        got = client.get(
            "/api/v1/series",
            params={"instance": inst["id"], "metric": "vllm:prompt_tokens_total", "start": T0 - 3600, "end": T0},
        )
        assert got.status_code == 200, got.text
        [trace] = got.json()["series"]
        assert sum(v is not None for _, v in trace["points"]) > 100
