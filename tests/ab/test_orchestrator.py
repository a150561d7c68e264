"""The experiment state machine, with the controller's real app side (profiles, rollouts, CAS)
and a stand-in for the agent that settles each claimed rollout; workloads from the sim's model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent.workloads.spec import WorkloadSpec
from app.ab.orchestrator import Limits, Orchestrator
from app.ab.ports import RolloutsPort, RunKey
from app.ab.service import ExperimentError, start_experiment
from app.profiles import parse_profile
from app.storage import ab_store as st
from app.storage import rollouts_store as rs
from app.storage.events import list_events
from tests.ab.modeled import modeled_probe_record

SPEC = {"kind": "probe", "prefix_tokens": 1500, "evict_prefixes": 2, "repetitions": 3}


class ModelExecutor:
    """Runs the probe on the sim's model for whatever profile the instance runs *now*."""

    def __init__(self, ctx: Any, instance_id: int, hold: bool = False) -> None:
        self.ctx, self.iid, self.hold = ctx, instance_id, hold
        self.done: dict[RunKey, dict[str, Any]] = {}
        self.pending: dict[RunKey, Callable[[], bool]] = {}
        self.argvs: list[list[str]] = []

    def start(self, key: RunKey, url: str, spec: WorkloadSpec, run_key: str, cancelled: Callable[[], bool]) -> None:
        cur = rs.instance_profiles(self.ctx.engine, self.iid)["current"]
        argv = parse_profile(cur["name"], cur["spec"]).to_argv()
        self.argvs.append(argv)
        rec = modeled_probe_record(argv, spec=spec, run_key=run_key, seed=key[0])
        if self.hold:
            self.pending[key] = cancelled
            self.done[key] = rec
        else:
            self.done[key] = rec

    def result(self, key: RunKey) -> dict[str, Any] | None:
        if key in self.pending:
            if not self.pending[key]():
                return None  # still "running" until cancelled
            del self.pending[key]
            return {**self.done.pop(key), "cancelled": True, "ok": False, "error": "cancelled"}
        return self.done.pop(key, None)

    def known(self, key: RunKey) -> bool:
        return key in self.done or key in self.pending


def agent_step(ctx: Any, host_id: int, now: float, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """What the agent does with claimed rollouts, reduced to the outcome: healthy, or rolled back."""
    for cmd in rs.claim_for_host(ctx.engine, host_id, "agent-1", now):
        name = cmd["payload"]["profile"]["name"]
        state = "rolled_back" if name in fail else "healthy"
        msg = "verification probe: HTTP 500 on the reload request; rolled back" if state == "rolled_back" else ""
        rs.apply_update(ctx.engine, rollout_id=cmd["id"], host_id=host_id, state=state, ts=now, message=msg,
                        data={}, now=now)


@pytest.fixture
def setup(app: Any, client: Any, token: str, batch_factory: Any, clock: Any) -> dict[str, Any]:
    r = client.post("/api/v1/ingest", json=batch_factory(1, clock()), headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    ctx = app.state.ctx
    inst = client.get("/api/v1/instances").json()["instances"][0]
    iid, host_id = int(inst["id"]), int(inst["host_id"])
    now = clock()
    rs.create_profile(ctx.engine, "no-offload", {}, now)
    rs.create_profile(ctx.engine, "offload-0.5", {"offload_size_gib": 0.5}, now)
    rs.create_profile(ctx.engine, "hybrid-offload", {"offload_size_gib": 8.0}, now)
    a = rs.get_profile(ctx.engine, "no-offload")
    assert a is not None
    rs.set_instance_profile(ctx.engine, iid, int(a["version_id"]), now, healthy=True)
    return {"ctx": ctx, "iid": iid, "host_id": host_id}


def drive(orch: Orchestrator, ctx: Any, host_id: int, clock: Any, eid: int, *, fail: set[str] = frozenset(),  # type: ignore[assignment]
          max_ticks: int = 200, on_tick: Callable[[int], None] | None = None) -> dict[str, Any]:
    for i in range(max_ticks):
        orch.tick(clock())
        agent_step(ctx, host_id, clock(), fail)
        if on_tick:
            on_tick(i)
        clock.advance(1.0)
        exp = st.get_experiment(ctx.engine, eid)
        assert exp is not None
        if exp["finished_at"] is not None:
            return exp
    raise AssertionError(f"experiment not finished after {max_ticks} ticks: {exp['state']} {exp['message']}")


def test_a_then_b_interleaved_verdict_and_back_on_a(setup: dict[str, Any], clock: Any) -> None:
    ctx, iid, host_id = setup["ctx"], setup["iid"], setup["host_id"]
    ex = ModelExecutor(ctx, iid)
    orch = Orchestrator(ctx.engine, RolloutsPort(ctx), ex, Limits(n_boot=500))
    eid = start_experiment(ctx, instance_id=iid, profile_b="offload-0.5", workload=SPEC, runs_per_arm=3, seed=4,
                           requested_by="test")
    exp = drive(orch, ctx, host_id, clock, eid)
    assert exp["state"] == "completed", exp["message"]
    assert exp["profile_a"] == "no-offload"  # A defaulted to the current profile
    runs = st.list_runs(ctx.engine, eid)
    assert [r["arm"] for r in runs] == ["A", "B", "A", "B", "A", "B"]
    assert all(r["state"] == "done" for r in runs)
    # The workload ran on the arm's profile each time (the executor saw the profile the controller applied).
    assert ex.argvs == [[], ["--kv-offloading-size", "0.5", "--kv-offloading-backend", "native"]] * 3
    assert runs[1]["argv"] == ["--kv-offloading-size", "0.5", "--kv-offloading-backend", "native"]
    assert runs[0]["rollout_id"] is None and runs[1]["rollout_id"] is not None  # run 1 was on A already
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
    eid = start_experiment(ctx, instance_id=iid, profile_b="hybrid-offload", workload=SPEC, runs_per_arm=2,
                           override_hybrid=True)
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
    eid = start_experiment(ctx, instance_id=iid, profile_a="offload-0.5", profile_b="no-offload", workload=SPEC,
                           runs_per_arm=2)

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
    eid = start_experiment(ctx, instance_id=iid, profile_b="offload-0.5", workload=SPEC, runs_per_arm=1)

    def forget(i: int) -> None:  # the app restarted: a new executor knows nothing of the running run
        ex.pending.clear()
        ex.done.clear()

    exp = drive(orch, ctx, host_id, clock, eid, on_tick=forget)
    assert exp["state"] == "failed" and "lost" in exp["message"]
