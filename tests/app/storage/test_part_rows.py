"""The typed rows of the parts' stores (controller, alerts, A/B) carry exactly the keys their
queries return, in the order the plain dicts of the row mapping had: a column added to a model
without its row type (or a key misspelt in a row type) fails here, not in a template."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table

from app.storage import ab_store as st
from app.storage import alerts_store as al
from app.storage import rollouts_store as rs
from app.storage.ab_models import AbExperiment, AbRun
from app.storage.ab_rows import ExperimentRow, RunRow
from app.storage.alert_models import Alert, AlertDelivery, AlertSilence, AlertTransition
from app.storage.alert_rows import AlertRow, AlertTransitionRow, DeliveryRow, SilenceRow
from app.storage.controller_models import ControllerProfile, ControllerProfileVersion, ControllerRollout
from app.storage.controller_rows import (
    ClaimedRollout,
    NamedVersionRow,
    ProfileDetail,
    ProfileRow,
    RolloutRow,
    StaleRollout,
    VersionRow,
)
from app.storage.ingest_store import IngestWriter
from app.storage.series_store import list_instances
from kvcore.protocol import PushBatch, Scrape

T0 = 1_800_000_000.0
URL = "http://127.0.0.1:8000"


def _columns(model: Any) -> list[str]:
    return [c.name for c in cast(Table, model.__table__).columns]


def _keys(row_type: Any) -> list[str]:
    return list(row_type.__annotations__)


def test_row_types_name_their_columns() -> None:
    assert _keys(VersionRow) == _columns(ControllerProfileVersion)
    assert _keys(NamedVersionRow) == [*_columns(ControllerProfileVersion), "name"]
    assert _keys(ProfileRow) == [*_columns(ControllerProfile), "version_id", "spec"]
    assert _keys(RolloutRow) == [
        *_columns(ControllerRollout),
        "profile_version",
        "profile",
        "instance_url",
        "host_id",
        "host",
    ]
    assert _keys(AlertRow) == [*_columns(Alert), "instance_url", "model", "simulated", "host"]
    assert _keys(AlertTransitionRow) == [
        *_columns(AlertTransition),
        "rule",
        "key",
        "instance_id",
        "instance_url",
        "host",
    ]
    assert _keys(DeliveryRow) == _columns(AlertDelivery)
    assert _keys(SilenceRow) == _columns(AlertSilence)
    assert _keys(ExperimentRow) == [*_columns(AbExperiment), "instance_url", "host_id", "host", "simulated"]
    assert _keys(RunRow) == _columns(AbRun)


def _instance(engine: Any) -> tuple[int, int]:
    res = IngestWriter(engine).write(
        PushBatch(agent_id="a", host="rig1", seq=1, sent_at=T0, scrapes=[Scrape(instance=URL, ts=T0, ok=True)]),
        T0,
    )
    return res.host_id, int(list_instances(engine)[0]["id"])


def test_rollouts_store_returns_its_row_types(engine: Any) -> None:
    host_id, iid = _instance(engine)
    created = rs.create_profile(engine, "p", {"offload_size_gib": 8}, T0)
    assert set(created) == set(ProfileDetail.__annotations__)
    assert [list(v) for v in created["versions"]] == [_keys(VersionRow)]
    [listed] = rs.list_profiles(engine)
    assert list(listed) == _keys(ProfileRow)
    version = rs.get_version(engine, created["version_id"])
    assert version is not None and list(version) == _keys(NamedVersionRow) and version["name"] == "p"
    rs.set_instance_profile(engine, iid, created["version_id"], T0, healthy=True)
    assert rs.instance_profiles(engine, iid) == {"current": version, "lkg": version}

    rid = rs.create_rollout(
        engine, instance_id=iid, version_id=created["version_id"], lkg_version_id=None, payload={"x": 1}, now=T0
    )
    ro = rs.get_rollout(engine, rid)
    assert ro is not None and list(ro) == _keys(RolloutRow)
    assert (ro["profile"], ro["profile_version"], ro["instance_url"], ro["host"]) == ("p", 1, URL, "rig1")
    assert rs.list_rollouts(engine) == [ro] and rs.active_rollout(engine, iid) == ro
    [claimed] = rs.claim_for_host(engine, host_id, "a", T0 + 1)
    assert list(claimed) == _keys(ClaimedRollout) and claimed == {"id": rid, "instance": URL, "payload": {"x": 1}}
    [stale] = rs.stale_rollouts(engine, updated_before=T0 + 100)
    assert list(stale) == _keys(StaleRollout) and stale["state"] == "claimed"


def test_alerts_store_returns_its_row_types(engine: Any) -> None:
    host_id, iid = _instance(engine)
    values = {
        "key": "agent_stale|instance:1",
        "rule": "agent_stale",
        "host_id": host_id,
        "instance_id": iid,
        "state": "firing",
        "severity": "warning",
        "opened_at": T0,
        "since": T0,
        "fired_at": T0,
        "resolved_at": None,
        "last_eval": T0,
        "value": 1.0,
        "baseline": None,
        "message": "m",
        "hints": [],
        "labels": {},
        "acked_at": None,
        "ack_note": None,
    }
    transitions = [al.TransitionRow(None, "firing", T0)]
    aid = al.open_alert(engine, values, transitions, [al.NewDelivery("hook", "firing", {})], T0)
    assert aid is not None
    row = al.get_alert(engine, aid)
    assert row is not None and list(row) == _keys(AlertRow)
    assert (row["instance_url"], row["host"], row["simulated"]) == (URL, "rig1", False)
    assert al.open_alerts(engine) == {values["key"]: row} and al.list_alerts(engine) == [row]
    [tr] = al.list_transitions(engine, alert_id=aid)
    assert list(tr) == _keys(AlertTransitionRow) and tr["instance_url"] == URL
    [d] = al.due_deliveries(engine, T0)
    assert list(d) == _keys(DeliveryRow) and d["payload"] == {"id": aid}
    assert al.list_deliveries(engine, alert_id=aid) == [d] and al.get_delivery(engine, d["id"]) == d
    al.add_silence(engine, now=T0, until=T0 + 60, rule="agent_stale")
    [s] = al.active_silences(engine, T0)
    assert list(s) == _keys(SilenceRow) and s["rule"] == "agent_stale"


def test_ab_store_returns_its_row_types(engine: Any) -> None:
    _host_id, iid = _instance(engine)
    eid = st.create_experiment(
        engine, instance_id=iid, profile_a="a", profile_b="b", workload={}, runs_per_arm=1, seed=0, now=T0
    )
    exp = st.get_experiment(engine, eid)
    assert exp is not None and list(exp) == _keys(ExperimentRow)
    assert (exp["instance_url"], exp["host"], exp["simulated"]) == (URL, "rig1", False)
    assert st.list_experiments(engine) == [exp] and st.unfinished_experiments(engine) == [exp]
    assert [e["id"] for e in st.claim_experiments(engine, "me", T0, 60.0)] == [eid]
    st.create_runs(engine, eid, [("A", None), ("B", None)])
    runs = st.list_runs(engine, eid)
    assert [list(r) for r in runs] == [_keys(RunRow)] * 2
    assert st.get_run(engine, eid, 1) == runs[1]
