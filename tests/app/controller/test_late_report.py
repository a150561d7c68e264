"""An agent's end of a rollout that reaches the app after the app expired it (the app, or the
agent, was down longer than rollout_silent_ttl_s; the spool drains when both are back) is the
rollout's end: the server runs what the agent says, so the app records it."""

from __future__ import annotations

from typing import Any

from app.storage import rollouts_store as rs
from tests.app.controller.test_rollouts_store import _instance


def _expired_rollout(engine: Any) -> tuple[int, int, int, int]:
    host_id, iid = _instance(engine)
    v = rs.create_profile(engine, "seqs32", {"extra_args": ["--max-num-seqs", "32"]}, 1.0)["version_id"]
    rid = rs.create_rollout(engine, instance_id=iid, version_id=v, lkg_version_id=None, payload={}, now=10.0)
    assert rs.claim_for_host(engine, host_id, "agent-rig1", 11.0)
    for state, ts in (("accepted", 12.0), ("restarting", 13.0)):
        assert rs.apply_update(engine, rollout_id=rid, host_id=host_id, state=state, ts=ts, message="", data={}, now=ts)
    # the app hears nothing for an hour (it was down, or the agent was) and gives up on it
    assert rs.finish_rollout(engine, rid, "expired", "the agent reported nothing", 3700.0, only_from=("restarting",))
    return host_id, iid, rid, int(v)


def test_the_agents_healthy_after_an_expiry_ends_the_rollout_and_sets_the_profile(engine: Any) -> None:
    host_id, iid, rid, v = _expired_rollout(engine)
    assert rs.apply_update(
        engine, rollout_id=rid, host_id=host_id, state="healthy", ts=40.0, message="seqs32 healthy", data={}, now=3710.0
    )
    got = rs.get_rollout(engine, rid)
    assert got is not None and got["state"] == "healthy" and "after the app had expired it" in got["message"]
    current = rs.instance_profiles(engine, iid)["current"]
    assert current is not None and current["id"] == v and current["name"] == "seqs32"


def test_only_an_end_replaces_an_expiry_and_only_from_the_instances_host(engine: Any) -> None:
    host_id, _iid, rid, _v = _expired_rollout(engine)
    kw: dict[str, Any] = {"rollout_id": rid, "ts": 40.0, "message": "", "data": {}, "now": 3710.0}
    assert not rs.apply_update(engine, host_id=host_id, state="waiting_health", **kw)  # not an end: stays expired
    assert not rs.apply_update(engine, host_id=host_id + 99, state="healthy", **kw)  # another host's agent
    assert rs.apply_update(engine, host_id=host_id, state="rolled_back", **kw)
    assert not rs.apply_update(engine, host_id=host_id, state="healthy", **kw)  # the agent's end is final
    got = rs.get_rollout(engine, rid)
    assert got is not None and got["state"] == "rolled_back"
