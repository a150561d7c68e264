"""Shared by the A/B tests: an instance with profiles, a stand-in agent that settles rollouts, and
an executor that runs the probe on the simulator's model for the profile the instance runs now."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent.workloads.spec import WorkloadSpec
from app.ab.orchestrator import Orchestrator
from app.ab.ports import RunKey
from app.controller.profiles import parse_profile
from app.storage import ab_store as st
from app.storage import rollouts_store as rs
from tests.app.ab.modeled import modeled_probe_record

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
        rs.apply_update(
            ctx.engine, rollout_id=cmd["id"], host_id=host_id, state=state, ts=now, message=msg, data={}, now=now
        )


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


def drive(
    orch: Orchestrator,
    ctx: Any,
    host_id: int,
    clock: Any,
    eid: int,
    *,
    fail: set[str] = frozenset(),  # type: ignore[assignment]
    max_ticks: int = 200,
    on_tick: Callable[[int], None] | None = None,
) -> dict[str, Any]:
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
