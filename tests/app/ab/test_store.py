"""The A/B tables on SQLite and PostgreSQL: one unfinished experiment per instance, CAS updates,
runs in order, events."""

from __future__ import annotations

from typing import Any

import pytest

from app.storage import ab_store as st
from app.storage.events import list_events
from app.storage.ingest_store import IngestWriter
from kvcore.protocol import PushBatch, Scrape

pytestmark = pytest.mark.both_databases


def _instance(engine: Any) -> int:
    IngestWriter(engine).write(
        PushBatch(
            agent_id="a",
            host="h",
            seq=1,
            sent_at=1000.0,
            scrapes=[Scrape(instance="http://127.0.0.1:8000", ts=1000.0, ok=True)],
        ),
        1000.0,
    )
    from app.storage.series_store import list_instances

    return int(list_instances(engine)[0]["id"])


def test_experiment_lifecycle_in_the_store(engine: Any) -> None:
    iid = _instance(engine)
    eid = st.create_experiment(
        engine,
        instance_id=iid,
        profile_a="a",
        profile_b="b",
        workload={"kind": "probe"},
        runs_per_arm=2,
        seed=1,
        now=1.0,
        requested_by="me",
        options={"override_hybrid": True},
    )
    with pytest.raises(st.ExperimentConflict, match="in progress"):
        st.create_experiment(
            engine, instance_id=iid, profile_a="a", profile_b="b", workload={}, runs_per_arm=1, seed=0, now=2.0
        )
    exp = st.get_experiment(engine, eid)
    assert exp is not None and exp["state"] == "pending" and exp["options"] == {"override_hybrid": True}
    assert exp["instance_url"] == "http://127.0.0.1:8000" and exp["host"] == "h"
    assert not st.update_experiment(engine, eid, 3.0, expect_state="running", state="restoring")
    assert st.update_experiment(
        engine, eid, 3.0, expect_state="pending", state="running", step="switch", event="started"
    )
    assert not st.update_experiment(engine, eid, 3.0, expect_step="run", step="running")
    st.create_runs(engine, eid, [("A", 10), ("B", 11), ("A", 10), ("B", 11)])
    runs = st.list_runs(engine, eid)
    assert [(r["idx"], r["arm"], r["version_id"], r["state"]) for r in runs] == [
        (0, "A", 10, "pending"),
        (1, "B", 11, "pending"),
        (2, "A", 10, "pending"),
        (3, "B", 11, "pending"),
    ]
    assert st.update_run(engine, runs[1]["id"], expect_state="pending", state="done", record={"x": [1, 2]})
    assert not st.update_run(engine, runs[1]["id"], expect_state="pending", state="failed")
    got = st.get_run(engine, eid, 1)
    assert got is not None and got["record"] == {"x": [1, 2]}
    assert [e["id"] for e in st.unfinished_experiments(engine)] == [eid]
    assert st.update_experiment(engine, eid, 9.0, state="completed", verdict={"call": "B is better"})
    exp = st.get_experiment(engine, eid)
    assert exp is not None and exp["finished_at"] == 9.0 and exp["verdict"] == {"call": "B is better"}
    assert not st.update_experiment(engine, eid, 10.0, state="failed")  # finished: frozen
    assert st.unfinished_experiments(engine) == []
    # finished: the instance may start another one
    st.create_experiment(
        engine, instance_id=iid, profile_a="a", profile_b="b", workload={}, runs_per_arm=1, seed=0, now=11.0
    )
    assert [e["id"] for e in st.list_experiments(engine, instance_id=iid)][1] == eid
    kinds = {e["kind"] for e in list_events(engine, instance_id=iid)}
    assert "ab" in kinds


def test_notes_on_an_experiment_are_kept_once_bounded_and_evented(engine: Any) -> None:
    iid = _instance(engine)
    eid = st.create_experiment(
        engine, instance_id=iid, profile_a="a", profile_b="b", workload={}, runs_per_arm=3, seed=0, now=1.0
    )
    assert st.add_note(engine, eid, "traffic paused", 2.0)
    assert st.add_note(engine, eid, "traffic paused", 3.0)  # the same note twice is kept once
    assert st.add_note(engine, eid, "x" * 5000, 4.0)
    exp = st.get_experiment(engine, eid)
    assert exp is not None and exp["options"]["notes"][0] == "traffic paused"
    assert len(exp["options"]["notes"]) == 2 and len(exp["options"]["notes"][1]) == st.MAX_NOTE_CHARS
    for i in range(st.MAX_NOTES):
        st.add_note(engine, eid, f"note {i}", 5.0)
    assert not st.add_note(engine, eid, "one too many", 6.0)  # refused past MAX_NOTES
    assert len(st.get_experiment(engine, eid)["options"]["notes"]) == st.MAX_NOTES  # type: ignore[index]
    assert not st.add_note(engine, 99999, "no such experiment", 6.0) and not st.add_note(engine, eid, "  ", 6.0)
    msgs = [e["message"] for e in list_events(engine, instance_id=iid, kinds=("ab",))]
    assert f"A/B experiment #{eid}: traffic paused" in msgs
