"""The controller's storage: profile history, instance profiles, rollout CAS and updates."""

from __future__ import annotations

from typing import Any

import pytest

from app.storage import rollouts_store as rs
from app.storage.events import list_events
from app.storage.ingest_store import IngestWriter
from kvcore.protocol import PushBatch, Scrape


def _instance(
    engine: Any, host: str = "rig1", url: str = "http://127.0.0.1:8000", now: float = 1000.0
) -> tuple[int, int]:
    w = IngestWriter(engine)
    res = w.write(
        PushBatch(
            agent_id=f"agent-{host}",
            host=host,
            seq=int(now),
            sent_at=now,
            scrapes=[Scrape(instance=url, ts=now, ok=True)],
        ),
        now,
    )
    from app.storage.series_store import list_instances

    iid = next(i["id"] for i in list_instances(engine) if i["url"] == url and i["host"] == host)
    return res.host_id, iid


def test_profile_history(engine: Any) -> None:
    rs.create_profile(engine, "p", {"offload_size_gib": 8}, 1.0, author="me")
    with pytest.raises(rs.StoreConflict):
        rs.create_profile(engine, "p", {}, 2.0)
    p = rs.edit_profile(engine, "p", {"offload_size_gib": 4}, 3.0, note="smaller")
    assert p["current_version"] == 2 and p["spec"] == {"offload_size_gib": 4}
    assert [v["version"] for v in p["versions"]] == [2, 1]
    assert p["versions"][1]["spec"] == {"offload_size_gib": 8}
    with pytest.raises(rs.StoreConflict, match="exactly these"):
        rs.edit_profile(engine, "p", {"offload_size_gib": 4}, 4.0)
    with pytest.raises(rs.NotFound):
        rs.edit_profile(engine, "nope", {}, 4.0)
    assert [x["name"] for x in rs.list_profiles(engine)] == ["p"]
    assert rs.list_profiles(engine)[0]["spec"] == {"offload_size_gib": 4}


def test_claim_is_compare_and_set_and_one_active_per_instance(engine: Any) -> None:
    host_id, iid = _instance(engine)
    other_host, _ = _instance(engine, host="rig2", url="http://127.0.0.1:9000", now=1001.0)
    v = rs.create_profile(engine, "p", {}, 1.0)["version_id"]
    rid = rs.create_rollout(
        engine, instance_id=iid, version_id=v, lkg_version_id=None, payload={"profile": {"name": "p"}}, now=10.0
    )
    with pytest.raises(rs.StoreConflict, match="in progress"):
        rs.create_rollout(engine, instance_id=iid, version_id=v, lkg_version_id=None, payload={}, now=11.0)
    # Another host's agent gets nothing.
    assert rs.claim_for_host(engine, other_host, "agent-rig2", 12.0) == []
    got = rs.claim_for_host(engine, host_id, "agent-a", 12.0)
    assert [c["id"] for c in got] == [rid] and got[0]["instance"] == "http://127.0.0.1:8000"
    # A second agent pushing for the same host does not steal it; the claimer gets it again.
    assert rs.claim_for_host(engine, host_id, "agent-b", 13.0) == []
    assert [c["id"] for c in rs.claim_for_host(engine, host_id, "agent-a", 14.0)] == [rid]
    r = rs.get_rollout(engine, rid)
    assert r is not None and r["state"] == "claimed" and r["claimed_by"] == "agent-a"
    # After the agent reports, it is no longer re-sent.
    assert rs.apply_update(
        engine,
        rollout_id=rid,
        host_id=host_id,
        state="preflight",
        ts=15.0,
        message="",
        data={"preflight": [{"name": "x"}]},
        now=15.0,
    )
    assert rs.claim_for_host(engine, host_id, "agent-a", 16.0) == []


def test_updates_finish_and_set_last_known_good(engine: Any) -> None:
    host_id, iid = _instance(engine)
    v = rs.create_profile(engine, "p", {"kv_cache_dtype": "fp8"}, 1.0)["version_id"]
    rid = rs.create_rollout(engine, instance_id=iid, version_id=v, lkg_version_id=None, payload={}, now=10.0)
    rs.claim_for_host(engine, host_id, "agent-a", 11.0)
    # An update from the wrong host, or with an unknown state, is refused.
    assert not rs.apply_update(
        engine, rollout_id=rid, host_id=host_id + 99, state="healthy", ts=12.0, message="", data={}, now=12.0
    )
    assert not rs.apply_update(
        engine, rollout_id=rid, host_id=host_id, state="bogus", ts=12.0, message="", data={}, now=12.0
    )
    assert rs.apply_update(
        engine,
        rollout_id=rid,
        host_id=host_id,
        state="healthy",
        ts=13.0,
        message="ok",
        data={"probe": {"steps": [1]}},
        now=13.0,
    )
    # Terminal: later updates are ignored.
    assert not rs.apply_update(
        engine, rollout_id=rid, host_id=host_id, state="failed", ts=14.0, message="", data={}, now=14.0
    )
    r = rs.get_rollout(engine, rid)
    assert r is not None and r["state"] == "healthy" and r["finished_at"] == 13.0
    assert r["result"]["probe"] == {"steps": [1]}
    assert [t["state"] for t in r["result"]["transitions"]] == ["healthy"]
    ip = rs.instance_profiles(engine, iid)
    assert ip["current"] is not None and ip["current"]["id"] == v
    assert ip["lkg"] is not None and ip["lkg"]["name"] == "p"
    # A new rollout is possible now.
    rs.create_rollout(engine, instance_id=iid, version_id=v, lkg_version_id=v, payload={}, now=20.0)
    states = [e["data"].get("state") for e in list_events(engine, instance_id=iid, kinds=("rollout",))]
    assert states == ["requested", "healthy", "claimed", "requested"]


def test_cancel_only_from_requested(engine: Any) -> None:
    host_id, iid = _instance(engine)
    v = rs.create_profile(engine, "p", {}, 1.0)["version_id"]
    rid = rs.create_rollout(engine, instance_id=iid, version_id=v, lkg_version_id=None, payload={}, now=10.0)
    rs.claim_for_host(engine, host_id, "a", 11.0)
    assert not rs.finish_rollout(engine, rid, "cancelled", "by user", 12.0, only_from=("requested",))
    assert rs.finish_rollout(engine, rid, "expired", "agent silent", 12.0, only_from=("claimed",))
    assert rs.stale_rollouts(engine, updated_before=1e9) == []
