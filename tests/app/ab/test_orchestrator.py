"""The experiment state machine, with the controller's real app side (profiles, rollouts, CAS)
and a stand-in for the agent that settles each claimed rollout; workloads from the sim's model."""

from __future__ import annotations

from typing import Any

import pytest

from app.ab.orchestrator import Limits, Orchestrator
from app.ab.ports import RolloutsPort
from app.ab.service import ExperimentError, start_experiment
from app.storage import ab_store as st
from app.storage import rollouts_store as rs
from app.storage.events import list_events
from tests.app.ab.conftest import SPEC, ModelExecutor, agent_step, drive


def test_a_then_b_interleaved_verdict_and_back_on_a(setup: dict[str, Any], clock: Any) -> None:
    ctx, iid, host_id = setup["ctx"], setup["iid"], setup["host_id"]
    ex = ModelExecutor(ctx, iid)
    orch = Orchestrator(ctx.engine, RolloutsPort(ctx), ex, Limits(n_boot=500))
    eid = start_experiment(
        ctx, instance_id=iid, profile_b="offload-0.5", workload=SPEC, runs_per_arm=3, seed=4, requested_by="test"
    )
    exp = drive(orch, ctx, host_id, clock, eid)
    assert exp["state"] == "completed", exp["message"]
    assert exp["profile_a"] == "no-offload"  # A defaulted to the current profile
    runs = st.list_runs(ctx.engine, eid)
    assert [r["arm"] for r in runs] == ["A", "B", "A", "B", "A", "B"]
    assert all(r["state"] == "done" for r in runs)
    # The workload ran on the arm's profile each time (the executor saw the profile the controller applied).
    assert ex.argvs == [[], ["--kv-offloading-size", "0.5", "--kv-offloading-backend", "native"]] * 3
    assert runs[1]["argv"] == ["--kv-offloading-size", "0.5", "--kv-offloading-backend", "native"]
    # Every run started from a restart onto its profile, the first one too (the instance was on A already).
    assert all(r["rollout_id"] is not None for r in runs)
    assert len({r["rollout_id"] for r in runs}) == 6
    v = exp["verdict"]
    assert v["call"] == "B is better"
    for r in runs:
        share = r["summary"]["share_external_kv_transfer"]
        assert (share > 0) if r["arm"] == "B" else (share == 0)
    # Back on A through a normal rollout, recorded as the instance's current profile.
    cur = rs.instance_profiles(ctx.engine, iid)["current"]
    assert cur is not None and cur["name"] == "no-offload"
    assert "previous profile" in exp["message"]
    msgs = [e["message"] for e in list_events(ctx.engine, instance_id=iid, kinds=("ab",))]
    assert any("B is better" in m for m in msgs) and any("completed" in m for m in msgs)


def test_failing_arm_ends_the_experiment_and_leaves_the_previous_profile(setup: dict[str, Any], clock: Any) -> None:
    ctx, iid, host_id = setup["ctx"], setup["iid"], setup["host_id"]
    orch = Orchestrator(ctx.engine, RolloutsPort(ctx), ModelExecutor(ctx, iid), Limits(n_boot=200))
    eid = start_experiment(
        ctx, instance_id=iid, profile_b="hybrid-offload", workload=SPEC, runs_per_arm=2, override_hybrid=True
    )
    exp = drive(orch, ctx, host_id, clock, eid, fail={"hybrid-offload"})
    assert exp["state"] == "failed"
    assert "arm B (hybrid-offload) did not come up" in exp["message"]
    assert "rolled_back" in exp["message"] and "HTTP 500" in exp["message"]
    assert "previous profile" in exp["message"]
    runs = st.list_runs(ctx.engine, eid)
    assert [r["state"] for r in runs[:2]] == ["done", "failed"]
    assert all(r["state"] == "pending" for r in runs[2:])
    cur = rs.instance_profiles(ctx.engine, iid)["current"]
    assert cur is not None and cur["name"] == "no-offload"
    # the override reached the controller's rollout
    rollout = rs.get_rollout(ctx.engine, int(runs[1]["rollout_id"]))
    assert rollout is not None and rollout["override_hybrid"] is True


def test_cancel_mid_run_restores_the_previous_profile(setup: dict[str, Any], clock: Any) -> None:
    ctx, iid, host_id = setup["ctx"], setup["iid"], setup["host_id"]
    ex = ModelExecutor(ctx, iid, hold=True)
    orch = Orchestrator(ctx.engine, RolloutsPort(ctx), ex, Limits(n_boot=200))
    eid = start_experiment(
        ctx, instance_id=iid, profile_a="offload-0.5", profile_b="no-offload", workload=SPEC, runs_per_arm=2
    )

    def maybe_cancel(i: int) -> None:
        exp = st.get_experiment(ctx.engine, eid)
        if exp and exp["state"] == "running" and exp["step"] == "running":
            assert orch.cancel(eid, clock(), by="test")

    exp = drive(orch, ctx, host_id, clock, eid, on_tick=maybe_cancel)
    assert exp["state"] == "cancelled"
    runs = st.list_runs(ctx.engine, eid)
    assert runs[0]["state"] == "cancelled"
    # A was offload-0.5 (not the current profile): the run switched to it, the end switched back.
    cur = rs.instance_profiles(ctx.engine, iid)["current"]
    assert cur is not None and cur["name"] == "no-offload"
    assert not orch.cancel(eid, clock())  # finished: nothing to cancel


def test_start_validation(setup: dict[str, Any]) -> None:
    ctx, iid = setup["ctx"], setup["iid"]
    with pytest.raises(ExperimentError, match="no profile named 'nope'"):
        start_experiment(ctx, instance_id=iid, profile_b="nope")
    with pytest.raises(ExperimentError, match="no instance 999"):
        start_experiment(ctx, instance_id=999, profile_b="offload-0.5")
    with pytest.raises(ExperimentError, match="workload: workload kind"):
        start_experiment(ctx, instance_id=iid, profile_b="offload-0.5", workload={"kind": "bogus"})
    with pytest.raises(ExperimentError, match="runs per arm"):
        start_experiment(ctx, instance_id=iid, profile_b="offload-0.5", runs_per_arm=0)
    start_experiment(ctx, instance_id=iid, profile_b="offload-0.5")
    with pytest.raises(ExperimentError, match="in progress") as exc:
        start_experiment(ctx, instance_id=iid, profile_b="offload-0.5")
    assert exc.value.status == 409


def test_lost_run_after_restart_fails_and_restores(setup: dict[str, Any], clock: Any) -> None:
    ctx, iid, host_id = setup["ctx"], setup["iid"], setup["host_id"]
    ex = ModelExecutor(ctx, iid, hold=True)
    orch = Orchestrator(ctx.engine, RolloutsPort(ctx), ex, Limits(n_boot=200))
    eid = start_experiment(ctx, instance_id=iid, profile_b="offload-0.5", workload=SPEC, runs_per_arm=2)

    def forget(i: int) -> None:  # the app restarted: a new executor knows nothing of the running run
        ex.pending.clear()
        ex.done.clear()

    exp = drive(orch, ctx, host_id, clock, eid, on_tick=forget)
    assert exp["state"] == "failed" and "lost" in exp["message"]


def test_two_app_processes_one_owner_and_takeover_after_the_lease(setup: dict[str, Any], clock: Any) -> None:
    ctx, iid, host_id = setup["ctx"], setup["iid"], setup["host_id"]
    ex1 = ModelExecutor(ctx, iid, hold=True)
    one = Orchestrator(ctx.engine, RolloutsPort(ctx), ex1, Limits(n_boot=200), owner="p1", lease_s=30)
    two = Orchestrator(
        ctx.engine, RolloutsPort(ctx), ModelExecutor(ctx, iid), Limits(n_boot=200), owner="p2", lease_s=30
    )
    eid = start_experiment(ctx, instance_id=iid, profile_b="offload-0.5", workload=SPEC, runs_per_arm=2)
    for _ in range(5):  # both tick; p1 claimed it first and keeps it
        one.tick(clock())
        two.tick(clock())
        agent_step(ctx, host_id, clock())
        clock.advance(1.0)
    exp = st.get_experiment(ctx.engine, eid)
    assert exp is not None and exp["owner"] == "p1" and exp["step"] == "running"
    clock.advance(31.0)  # p1 died mid-run: its lease runs out, p2 takes over and finds the run lost
    exp = drive(two, ctx, host_id, clock, eid)
    assert exp["owner"] == "p2" and exp["state"] == "failed" and "lost" in exp["message"]
    cur = rs.instance_profiles(ctx.engine, iid)["current"]
    assert cur is not None and cur["name"] == "no-offload"


def test_failure_after_some_runs_keeps_a_partial_verdict(setup: dict[str, Any], clock: Any) -> None:
    ctx, iid, host_id = setup["ctx"], setup["iid"], setup["host_id"]

    class FailingThird(ModelExecutor):
        def start(self, key: Any, url: str, spec: Any, run_key: str, cancelled: Any) -> None:
            super().start(key, url, spec, run_key, cancelled)
            if key[1] == 2:  # the third run: the server answers 500 to everything
                rec = self.done[key]
                rec["requests"] = [{**r, "ok": False, "error": "HTTP 500: EngineCore died"} for r in rec["requests"]]

    orch = Orchestrator(ctx.engine, RolloutsPort(ctx), FailingThird(ctx, iid), Limits(n_boot=200))
    eid = start_experiment(ctx, instance_id=iid, profile_b="offload-0.5", workload=SPEC, runs_per_arm=3)
    exp = drive(orch, ctx, host_id, clock, eid)
    assert exp["state"] == "failed"
    assert "arm A (no-offload) failed in run 3" in exp["message"] and "HTTP 500: EngineCore died" in exp["message"]
    v = exp["verdict"]
    assert v["partial"] is True and v["summary"].startswith("Partial result (failed after 2 of 6 runs)")
    assert {m["runs_a"] for m in v["headline"] if m["available"]} == {1}
    assert v["call"] == "inconclusive: too few runs"  # one run per arm never names a winner
    assert not any(m["significant"] for m in v["headline"])
    cur = rs.instance_profiles(ctx.engine, iid)["current"]
    assert cur is not None and cur["name"] == "no-offload"


def test_a_run_with_foreign_traffic_is_flagged_and_left_out_of_the_verdict(setup: dict[str, Any], clock: Any) -> None:
    ctx, iid, host_id = setup["ctx"], setup["iid"], setup["host_id"]

    class Busy(ModelExecutor):  # someone else sent 40 requests during the second run
        def start(self, key: Any, url: str, spec: Any, run_key: str, cancelled: Any) -> None:
            super().start(key, url, spec, run_key, cancelled)
            if key[1] == 1:
                ours = len(self.done[key]["requests"])
                self.done[key]["foreign"] = {"sent": ours, "requests": 40, "request_share": 40 / (40 + ours)}

    orch = Orchestrator(ctx.engine, RolloutsPort(ctx), Busy(ctx, iid), Limits(n_boot=300))
    eid = start_experiment(ctx, instance_id=iid, profile_b="offload-0.5", workload=SPEC, runs_per_arm=3)
    assert st.get_experiment(ctx.engine, eid)["options"]["plan"]["max_foreign_share"] == 0.05  # type: ignore[index]
    exp = drive(orch, ctx, host_id, clock, eid)
    assert exp["state"] == "completed"
    runs = st.list_runs(ctx.engine, eid)
    assert runs[1]["state"] == "done" and runs[1]["message"].startswith("left out of the verdict: foreign traffic")
    assert "40 requests" in runs[1]["summary"]["contaminated"]
    v = exp["verdict"]
    assert v["excluded"] == [{"idx": 1, "arm": "B", "reason": runs[1]["summary"]["contaminated"]}]
    assert v["runs_used"] == {"A": 3, "B": 2} and v["call"] == "inconclusive: too few runs"
    assert "(1 left out as contaminated)" in v["summary"]


def test_a_tick_takes_every_step_that_waits_for_nothing(setup: dict[str, Any], clock: Any) -> None:
    """Start -> switch (the rollout requested) in one tick; rollout healthy -> run started in the
    next; the run's record -> the next run's switch requested in the one after: no tick is spent
    idling between a step that is done and one that can start."""
    ctx, iid, host_id = setup["ctx"], setup["iid"], setup["host_id"]
    orch = Orchestrator(ctx.engine, RolloutsPort(ctx), ModelExecutor(ctx, iid), Limits(n_boot=200))
    eid = start_experiment(ctx, instance_id=iid, profile_b="offload-0.5", workload=SPEC, runs_per_arm=2)

    def tick() -> dict[str, Any]:
        orch.tick(clock())
        exp = st.get_experiment(ctx.engine, eid)
        assert exp is not None
        clock.advance(1.0)
        return dict(exp)

    exp = tick()  # pending -> running, and the first switch requested at once
    assert (exp["state"], exp["step"], exp["current_run"]) == ("running", "switching", 0)
    agent_step(ctx, host_id, clock())  # the agent reports the rollout healthy
    exp = tick()  # healthy -> run -> the workload started (the model executor answers at once)
    assert (exp["step"], exp["current_run"]) == ("running", 0)
    exp = tick()  # the record -> run 2's switch requested in the same tick
    assert (exp["step"], exp["current_run"]) == ("switching", 1)
    run0 = st.get_run(ctx.engine, eid, 0)
    assert run0 is not None and run0["state"] == "done"
    exp = drive(orch, ctx, host_id, clock, eid)
    assert exp["state"] == "completed", exp["message"]
