"""The same models, migrations, ingest and reads on SQLite and on a real PostgreSQL, and several
app processes writing to one database at once (replays never stored twice, no double-created
hosts/instances/series)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app.derived.series_reader import SeriesQuery, read_series
from app.ingest.parse import parse_batch
from app.storage.ingest_store import IngestWriter
from app.storage.models import Base, Host, IngestBatch, Instance, SampleRow, Series
from app.storage.series_store import list_instances

WORKER = Path(__file__).with_name("ingest_worker.py")
T0 = 1_800_000_000.0


@pytest.fixture
def db(db_url: str) -> Iterator[Any]:
    from app.storage.engine import open_database

    eng = open_database(db_url)
    yield eng
    eng.dispose()


def _count(engine: Any, model: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def _batch(
    seq: int,
    ts: float,
    *,
    agent: str = "agent-1",
    host: str = "rig1",
    n_series: int = 5,
    instance: str = "http://127.0.0.1:8000",
) -> dict[str, Any]:
    samples = [
        {
            "name": "vllm:prompt_tokens_by_source_total",
            "labels": {"model_name": "m", "engine": "0", "source": f"src{i}"},
            "value": float(seq * 10 + i),
        }
        for i in range(n_series)
    ]
    samples.append({"name": "vllm:kv_cache_usage_perc", "labels": {"model_name": "m"}, "value": 0.5})
    return {
        "agent_id": agent,
        "host": host,
        "seq": seq,
        "sent_at": ts,
        "scrapes": [
            {
                "instance": instance,
                "ts": ts,
                "ok": True,
                "healthy": True,
                "model": "m",
                "types": {"vllm:prompt_tokens_by_source": "counter", "vllm:kv_cache_usage_perc": "gauge"},
                "samples": samples,
            }
        ],
        "host_ts": ts,
        "host_samples": [{"name": "kvscope:host_memory_available_bytes", "labels": {}, "value": 1e9 + seq}],
        "host_types": {"kvscope:host_memory_available_bytes": "gauge"},
    }


def _write(writer: IngestWriter, body: dict[str, Any]) -> Any:
    batch = parse_batch(json.dumps(body).encode(), body["sent_at"], max_future_skew_s=300, max_past_age_s=1e9)
    return writer.write(batch, body["sent_at"])


def test_migrations_match_the_models(db: Any) -> None:
    """Alembic's autogenerate finds nothing to change: every model is migrated, on both engines."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    import app.storage

    for mod in pkgutil.iter_modules(app.storage.__path__):  # every area's models join Base.metadata
        importlib.import_module(f"app.storage.{mod.name}")
    with db.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    # Expression indexes (coalesce) are not reflected the same way by every dialect: ignore those.
    real = [
        d
        for d in diffs
        if not (
            isinstance(d, tuple)
            and d[0] in ("add_index", "remove_index")
            and "coalesce" in str(d[1]).lower() + str(getattr(d[1], "expressions", ""))
        )
    ]
    real = [d for d in real if not (isinstance(d, tuple) and getattr(d[1], "name", "") == "uq_series_identity")]
    assert real == [], f"models and migrations differ on {db.dialect.name}: {real}"


def test_ingest_and_read_back(db: Any) -> None:
    writer = IngestWriter(db)
    for seq in range(1, 11):
        res = _write(writer, _batch(seq, T0 + seq))
        assert not res.duplicate and res.stored == 7
    again = _write(writer, _batch(3, T0 + 3))
    assert again.duplicate and again.stored == 0
    insts = list_instances(db)
    assert [(i["host"], i["url"], i["model"]) for i in insts] == [("rig1", "http://127.0.0.1:8000", "m")]
    pts = read_series(db, SeriesQuery(["vllm:prompt_tokens_by_source_total"], T0, T0 + 100, instance_id=insts[0]["id"]))
    assert sorted(p.labels["source"] for p in pts) == [f"src{i}" for i in range(5)]
    src2 = next(p for p in pts if p.labels["source"] == "src2")
    assert src2.kind == "counter"
    assert src2.points == [(T0 + s, float(s * 10 + 2)) for s in range(1, 11)]
    host_pts = read_series(
        db, SeriesQuery(["kvscope:host_memory_available_bytes"], T0, T0 + 100, host_id=insts[0]["host_id"])
    )
    assert len(host_pts) == 1 and host_pts[0].labels == {} and len(host_pts[0].points) == 10
    assert _count(db, SampleRow) == 70


def test_fresh_writer_continues_counters_across_processes(db: Any) -> None:
    """A second app process (fresh caches) sees the last stored counter value: a drop is a reset."""
    _write(IngestWriter(db), _batch(1, T0 + 1))
    body = _batch(2, T0 + 2)
    body["scrapes"][0]["samples"][0]["value"] = 0.0  # src0 went down: a restart of vLLM
    res = _write(IngestWriter(db), body)
    assert res.resets == ["http://127.0.0.1:8000"]


def _run_workers(tmp_path: Path, url: str, plans: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    go = tmp_path / "go"
    procs = []
    outs = []
    try:
        for i, batches in enumerate(plans):
            bf = tmp_path / f"batches{i}.json"
            bf.write_text(json.dumps(batches))
            out = tmp_path / f"out{i}.json"
            outs.append(out)
            procs.append(subprocess.Popen([sys.executable, str(WORKER), url, str(bf), str(go), str(out)]))
        go.touch()  # every worker starts at once (their imports are done while they wait)
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [json.loads(o.read_text()) for o in outs]


def test_two_processes_replaying_the_same_batches_store_each_once(db: Any, db_url: str, tmp_path: Path) -> None:
    """An agent whose push timed out retries on another app process: each batch is stored once."""
    batches = [_batch(seq, T0 + seq) for seq in range(1, 41)]
    results = _run_workers(tmp_path, db_url, [batches, list(reversed(batches))])
    assert [r["errors"] for r in results] == [[], []]
    assert sum(r["stored"] for r in results) == 40
    assert sum(r["duplicate"] for r in results) == 40
    assert _count(db, IngestBatch) == 40
    assert _count(db, SampleRow) == 40 * 7
    assert _count(db, Host) == 1 and _count(db, Instance) == 1
    assert _count(db, Series) == 7


def test_concurrent_first_pushes_of_new_hosts_never_fail(db: Any, db_url: str, tmp_path: Path) -> None:
    """Three processes create the same hosts, instances and series at the same moment: the
    loser of each race uses the winner's row (no unique-violation errors, no duplicates)."""
    hosts = 20
    plans = [
        [_batch(seq, T0 + seq, agent=f"agent-{h}-{w}", host=f"rig{h}") for seq in (1, 2) for h in range(hosts)]
        for w in range(3)
    ]
    results = _run_workers(tmp_path, db_url, plans)
    assert [r["errors"] for r in results] == [[], [], []]
    assert sum(r["stored"] for r in results) == 3 * 2 * hosts
    assert _count(db, Host) == hosts and _count(db, Instance) == hosts
    assert _count(db, Series) == hosts * 7
    # Same (series, ts) from the agents of one host: stored once (on conflict do nothing).
    assert _count(db, SampleRow) == hosts * 2 * 7


def test_several_app_processes_never_double_claim_a_rollout(db: Any, db_url: str, tmp_path: Path) -> None:
    """Agents of one host pushing to three app processes at once: every requested rollout is
    handed to exactly one agent (the controller's compare-and-set claim), with one event each."""
    from app.storage import rollouts_store as rs
    from app.storage.events import list_events

    writer = IngestWriter(db)
    n = 8
    for i in range(n):
        _write(writer, _batch(i + 1, T0 + i, instance=f"http://127.0.0.1:{8000 + i}"))
    insts = list_instances(db)
    host_id = insts[0]["host_id"]
    v = rs.create_profile(db, "small-cpu-tier", {}, T0)["version_id"]
    rids = {
        rs.create_rollout(
            db,
            instance_id=i["id"],
            version_id=v,
            lkg_version_id=None,
            payload={"profile": {"name": "small-cpu-tier"}},
            now=T0 + 20,
        )
        for i in insts
    }
    go = tmp_path / "go"
    procs, outs = [], []
    try:
        for w in range(3):
            out = tmp_path / f"claims{w}.json"
            outs.append(out)
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(WORKER.with_name("claim_worker.py")),
                        db_url,
                        str(host_id),
                        f"agent-{w}",
                        "20",
                        str(go),
                        str(out),
                    ]
                )
            )
        go.touch()
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = [json.loads(o.read_text()) for o in outs]
    assert [r["errors"] for r in results] == [[], [], []]
    handed = [set(r["ids"]) for r in results]
    assert set().union(*handed) == rids
    assert sum(len(h) for h in handed) == n, f"a rollout went to two agents: {handed}"
    for w, ids in enumerate(handed):
        for rid in ids:
            r = rs.get_rollout(db, rid)
            assert r is not None and r["state"] == "claimed" and r["claimed_by"] == f"agent-{w}"
    claims = [e for e in list_events(db, kinds=("rollout",)) if e["data"].get("state") == "claimed"]
    assert sorted(e["data"]["rollout_id"] for e in claims) == sorted(rids)


def test_several_app_processes_never_double_send_an_alert(db: Any, db_url: str, tmp_path: Path) -> None:
    """Three processes evaluating and delivering at once: one opens the alert, one wins each
    compare-and-set transition, and every notification is claimed and sent exactly once."""
    import time as _time

    from app.storage.alerts_store import NewDelivery, TransitionRow, add_deliveries, list_deliveries, open_alert

    now = _time.time() - 10
    first = open_alert(
        db,
        {
            "key": "k1",
            "rule": "r",
            "state": "firing",
            "severity": "warning",
            "opened_at": now,
            "since": now,
            "last_eval": now,
            "message": "m",
            "hints": [],
            "labels": {},
        },
        [TransitionRow(None, "firing", now)],
        [],
        now,
    )
    assert first == 1
    queued = add_deliveries(db, None, [NewDelivery("webhook", "test", {"n": i}) for i in range(60)], now)
    go = tmp_path / "go"
    procs, outs = [], []
    try:
        for w in range(3):
            out = tmp_path / f"alerts{w}.json"
            outs.append(out)
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER.with_name("alerts_worker.py")), db_url, f"app-{w}", str(go), str(out)]
                )
            )
        go.touch()
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = [json.loads(o.read_text()) for o in outs]
    assert [r["errors"] for r in results] == [[], [], []]
    assert sum(r["opened"] is not None for r in results) == 1, "the same alert was opened twice"
    assert sum(bool(r["cas"]) for r in results) == 1, "one transition applied twice"
    sent = [i for r in results for i in r["sent"]]
    assert len(sent) == len(set(sent)), "a notification was sent twice"
    deliveries = list_deliveries(db, limit=1000)
    ids = {int(d["id"]) for d in deliveries}
    assert set(queued) <= ids and set(sent) == ids  # 60 queued + firing + resolved, each sent once
    assert len(ids) == 62
    assert all(d["status"] == "sent" and d["attempts"] == 1 for d in deliveries)
