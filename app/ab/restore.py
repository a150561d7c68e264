"""The way out of every experiment (cancel, failure, the normal end): back to the profile the
instance had before, through a normal rollout when it is not there already, then the end state
(with a partial verdict when a failed or cancelled experiment finished runs in both arms)."""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import Engine

from app.ab.ports import ControllerPort, SwitchBusy, SwitchRefused
from app.storage import ab_store as st
from app.storage.ab_rows import ExperimentRow


class SwitchLimits(Protocol):
    @property
    def switch_timeout_s(self) -> float: ...


class OrchestratorView(Protocol):
    """What the way out needs of the orchestrator that calls it (app.ab.orchestrator.Orchestrator
    is one): restore sits below it and imports nothing from it."""

    @property
    def engine(self) -> Engine: ...

    @property
    def port(self) -> ControllerPort: ...

    @property
    def limits(self) -> SwitchLimits: ...

    def verdict(self, exp: ExperimentRow) -> dict[str, Any]:
        """The experiment's verdict from its finished runs."""

    def _arm_profile(self, exp: ExperimentRow, arm: str) -> str:
        """The profile name arm "A" or "B" runs."""


def restoring(orch: OrchestratorView, exp: ExperimentRow, now: float) -> None:
    eid, iid = int(exp["id"]), int(exp["instance_id"])
    outcome = str(exp["outcome"] or "failed")
    base = str(exp["message"] or "") if outcome == "failed" else ""
    prev_id = exp["previous_version_id"]
    # A rollout we started (a switch cut short, or the restore itself) must end first.
    rid = exp["rollout_id"]
    if rid is not None:
        r = orch.port.rollout(int(rid))
        if r is not None and r.get("finished_at") is None:
            if now - float(exp["step_started_at"] or now) > orch.limits.switch_timeout_s:
                finish(orch, exp, now, outcome, _join(base, f"rollout #{rid} did not end; check the instance"))
            else:
                st.update_experiment(
                    orch.engine,
                    eid,
                    now,
                    expect_step=exp["step"],
                    message=_join(base, f"waiting for rollout #{rid} ({r.get('state')})"),
                )
            return
        if exp["step"] == "restoring":  # our restore rollout is over
            ok = r is not None and r.get("state") == "healthy"
            finish(
                orch,
                exp,
                now,
                outcome,
                _join(
                    base,
                    (
                        f"back on the previous profile (rollout #{rid})"
                        if ok
                        else "could not restore the previous profile: "
                        f"rollout #{rid} {r.get('state') if r else 'vanished'}"
                    ),
                ),
            )
            return
    if prev_id is None:
        finish(orch, exp, now, outcome, _join(base, "no previous profile was recorded: the instance stays as is"))
        return
    current = orch.port.current(iid)
    if current is not None and int(current["id"]) == int(prev_id) and orch.port.active(iid) is None:
        finish(orch, exp, now, outcome, _join(base, f"instance on its previous profile ({current['name']})"))
        return
    if orch.port.active(iid) is not None:
        st.update_experiment(orch.engine, eid, now, message=_join(base, "waiting for a rollout in progress"))
        return
    name = version_name(orch, exp, int(prev_id))
    if name is None:
        finish(orch, exp, now, outcome, _join(base, "the previous profile no longer exists; instance left as is"))
        return
    try:
        rid = orch.port.request(iid, name, now, requested_by=f"A/B #{eid} (restore)", override_hybrid=False)
    except SwitchBusy:
        return
    except SwitchRefused as exc:
        finish(orch, exp, now, outcome, _join(base, f"could not restore the previous profile: {exc}"))
        return
    st.update_experiment(
        orch.engine,
        eid,
        now,
        step="restoring",
        rollout_id=rid,
        step_started_at=now,
        message=_join(base, f"restoring {name} (rollout #{rid})"),
    )


def version_name(orch: OrchestratorView, exp: ExperimentRow, version_id: int) -> str | None:
    current = orch.port.current(int(exp["instance_id"]))
    if current is not None and int(current["id"]) == version_id:
        return str(current["name"])
    for arm, vid in (("A", exp["version_a_id"]), ("B", exp["version_b_id"])):
        if vid is not None and int(vid) == version_id:
            return orch._arm_profile(exp, arm)
    getter = getattr(orch.port, "version", None)
    if getter is not None:
        v = getter(version_id)
        return str(v["name"]) if v else None
    return None


def finish(orch: OrchestratorView, exp: ExperimentRow, now: float, outcome: str, message: str) -> None:
    eid = int(exp["id"])
    extra: dict[str, Any] = {}
    if outcome != "completed" and not exp.get("verdict"):
        done = [r for r in st.list_runs(orch.engine, eid) if r["state"] == "done"]
        if {r["arm"] for r in done} == {"A", "B"}:  # what the finished runs say, labelled partial
            v = orch.verdict(exp)
            v["partial"] = True
            v["summary"] = (
                f"Partial result ({outcome} after {len(done)} of {2 * int(exp['runs_per_arm'])} runs): {v['summary']}"
            )
            extra["verdict"] = v
    st.update_experiment(
        orch.engine,
        eid,
        now,
        state=outcome,
        outcome=outcome,
        step="",
        message=message,
        rollout_id=None,
        event=f"A/B experiment #{eid} {outcome}: {message}",
        **extra,
    )


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b
