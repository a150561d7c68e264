"""Workloads run by the agent: the agent's runner (commands in, record events out, cancel, bad
commands) and the app's AgentExecutor (commands per host until the record comes back)."""

from __future__ import annotations

import threading
import time
from typing import Any

from agent.workloads.agent_side import WorkloadRunner
from agent.workloads.spec import WorkloadSpec
from app.ab.agent_executor import AgentExecutor, workload_command_id
from app.storage import ab_store as st
from kvcore.protocol import AgentEvent, Command, PushBatch
from tests.waits import wait_until


def _wait_events(runner: WorkloadRunner, n: int = 1) -> list[AgentEvent]:
    got: list[AgentEvent] = []

    def enough() -> bool:
        got.extend(runner.drain_events())
        return len(got) >= n

    wait_until(enough, f"{n} event(s) from the worker thread", interval=0.01)
    return got


def test_runner_runs_reports_and_dedups() -> None:
    calls: list[tuple[str, str]] = []

    def run(url: str, spec: WorkloadSpec, *, run_key: str, cancelled: Any) -> dict[str, Any]:
        calls.append((url, run_key))
        return {"ok": True, "requests": [], "kind": spec.kind}

    r = WorkloadRunner(run=run, clock=lambda: 5.0, allowed=lambda url: url == "http://v")
    cmd = Command(
        id=-1,
        kind="workload",
        instance="http://v",
        payload={"key": [3, 1], "run_key": "ab3-1", "workload": {"kind": "probe"}},
    )
    r.submit(cmd, 0.0)
    r.submit(cmd, 0.0)  # the app re-sends until the record arrives: run once
    (ev,) = _wait_events(r)
    assert calls == [("http://v", "ab3-1")]
    assert ev.kind == "note" and ev.ts == 5.0 and ev.instance == "http://v" and "3:1 done" in ev.message
    assert ev.data["ab_run"] == {"key": [3, 1], "record": {"ok": True, "requests": [], "kind": "probe"}}
    r.close()


def test_runner_refuses_bad_and_foreign_commands_with_a_record() -> None:
    r = WorkloadRunner(run=lambda *a, **k: {"ok": True}, allowed=lambda url: url == "http://v")
    r.submit(Command(id=-2, kind="workload", instance="http://v", payload={}), 0.0)
    r.submit(
        Command(
            id=-3, kind="workload", instance="http://other", payload={"key": [1, 0], "workload": {"kind": "probe"}}
        ),
        0.0,
    )
    r.submit(
        Command(id=-4, kind="workload", instance="http://v", payload={"key": [1, 1], "workload": {"kind": "nope"}}), 0.0
    )
    evs = r.drain_events()
    errors = [e.data["ab_run"]["record"]["error"] for e in evs]
    assert "needs key and workload" in errors[0]
    assert "not managed by this agent" in errors[1] and evs[1].data["ab_run"]["key"] == [1, 0]
    assert "invalid workload: workload kind" in errors[2]


def test_runner_cancel_and_crash() -> None:
    started = threading.Event()

    def run(url: str, spec: WorkloadSpec, *, run_key: str, cancelled: Any) -> dict[str, Any]:
        if run_key == "boom":
            raise RuntimeError("bug")
        started.set()
        while not cancelled():
            time.sleep(0.01)
        return {"ok": False, "cancelled": True, "error": "cancelled"}

    r = WorkloadRunner(run=run)
    wl = {"kind": "probe"}
    r.submit(Command(id=-10, kind="workload", instance="http://v", payload={"key": [1, 0], "workload": wl}), 0.0)
    assert started.wait(30)
    r.submit(Command(id=-11, kind="workload_cancel", instance="http://v", payload={"key": [1, 0]}), 0.0)
    (ev,) = _wait_events(r)
    assert ev.data["ab_run"]["record"]["cancelled"] is True
    r.submit(
        Command(
            id=-12, kind="workload", instance="http://v", payload={"key": [1, 1], "run_key": "boom", "workload": wl}
        ),
        0.0,
    )
    (ev,) = _wait_events(r)
    assert "workload runner error: RuntimeError: bug" in ev.data["ab_run"]["record"]["error"]
    r.close()
    r.submit(Command(id=-13, kind="workload", instance="http://v", payload={"key": [1, 2], "workload": wl}), 0.0)
    assert r.drain_events() == []


def test_command_ids_never_collide() -> None:
    ids = {workload_command_id((e, i), c) for e in range(1, 30) for i in range(100) for c in (False, True)}
    assert len(ids) == 29 * 100 * 2 and max(ids) < 0


def test_agent_executor_hands_commands_to_the_right_host_until_the_record_comes(
    setup: dict[str, Any], clock: Any
) -> None:
    ctx, iid, host_id = setup["ctx"], setup["iid"], setup["host_id"]
    eid = st.create_experiment(
        ctx.engine, instance_id=iid, profile_a="a", profile_b="b", workload={}, runs_per_arm=1, seed=0, now=clock()
    )
    ex = AgentExecutor(ctx.engine)
    stop = {"v": False}
    ex.start((eid, 0), "http://127.0.0.1:8000", WorkloadSpec(kind="probe"), "rk", lambda: stop["v"])
    assert ex.known((eid, 0)) and ex.result((eid, 0)) is None
    assert ex.commands_for(host_id + 1, "other", clock()) == []
    (cmd,) = ex.commands_for(host_id, "agent-1", clock())
    assert cmd["kind"] == "workload" and cmd["id"] == workload_command_id((eid, 0))
    assert cmd["payload"]["key"] == [eid, 0] and cmd["payload"]["workload"]["kind"] == "probe"
    assert ex.commands_for(host_id, "agent-1", clock()) == [cmd]  # again until the record comes back
    stop["v"] = True
    kinds = [c["kind"] for c in ex.commands_for(host_id, "agent-1", clock())]
    assert kinds == ["workload", "workload_cancel"]

    def batch(key: Any, record: Any) -> PushBatch:
        return PushBatch(
            agent_id="agent-1",
            host="rig1",
            seq=1,
            sent_at=clock(),
            events=[
                AgentEvent(ts=clock(), kind="note", message="x", data={"ab_run": {"key": key, "record": record}}),
                AgentEvent(ts=clock(), kind="note", message="unrelated", data={"other": 1}),
            ],
        )

    ex.on_push(batch([eid, 0], {"ok": True}), host_id + 1, clock())  # another host: ignored
    ex.on_push(batch([eid, 9], {"ok": True}), host_id, clock())  # unknown run: ignored
    ex.on_push(batch("garbage", {"ok": True}), host_id, clock())
    assert ex.result((eid, 0)) is None
    ex.on_push(batch([eid, 0], {"ok": True, "requests": []}), host_id, clock())
    assert ex.commands_for(host_id, "agent-1", clock()) == []
    assert ex.result((eid, 0)) == {"ok": True, "requests": []}
    assert not ex.known((eid, 0))
