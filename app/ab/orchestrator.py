"""Moves experiments forward on each tick, a step at a time (a function of `now`; nothing here blocks).

    pending -> running: switch (rollout to the run's profile: a restart, even onto the same profile)
                        -> switching (wait for the rollout: healthy, or the arm failed)
                        -> run (start the workload on the executor) -> running (wait for the record)
                        -> next run ... -> verdict
            -> restoring (back to the profile the instance had before) -> completed | failed | cancelled
    cancel: running -> cancelling (the workload stops between requests) -> restoring -> cancelled

Every way out goes through `restoring`, so cancel, failure and the normal end all put the
instance back on its previous profile (through a normal rollout, when it is not there already).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from agent.workloads.spec import WorkloadSpec, parse_workload
from app.ab import restore
from app.ab.ports import ControllerPort, RunExecutor, SwitchBusy, SwitchRefused
from app.ab.results import contamination, summarise_run
from app.ab.verdict import DEFAULT_MAX_FOREIGN_SHARE, compute_verdict, experiment_plan, focus_tags
from app.derived.series_reader import SeriesQuery, read_series
from app.storage import ab_store as st
from app.storage.ab_rows import ExperimentRow, RunRow

log = logging.getLogger("kvscope.ab")
FAILED_ROLLOUT_STATES = frozenset({"rolled_back", "failed", "refused", "cancelled", "expired"})
# Steps of a running experiment that act at once (they wait for nothing): a tick that reaches one
# takes it too, up to MAX_STEPS_PER_TICK steps per experiment and tick.
READY_STEPS = frozenset({"switch", "run"})
MAX_STEPS_PER_TICK = 4


# An arm's profile switch (a rollout: restart, health, probe) must end within this: a large model
# loads in minutes, half an hour means it will not
SWITCH_TIMEOUT_S = 1800.0
RUN_TIMEOUT_S = 3600.0  # one workload run must end within this (the longest built-in runs minutes)
MAX_ERROR_RATE = 0.5  # a run with a larger share of failed requests fails its arm: it measured errors


@dataclass
class Limits:
    switch_timeout_s: float = SWITCH_TIMEOUT_S
    run_timeout_s: float = RUN_TIMEOUT_S
    max_error_rate: float = MAX_ERROR_RATE
    n_boot: int = 2000
    max_foreign_share: float = DEFAULT_MAX_FOREIGN_SHARE  # above: the run is left out of the verdict


def plan_runs(runs_per_arm: int) -> list[str]:
    """Interleaved arms: A B A B ..."""
    return ["A", "B"] * runs_per_arm


class Orchestrator:
    def __init__(
        self,
        engine: Engine,
        port: ControllerPort,
        executor: RunExecutor,
        limits: Limits | None = None,
        owner: str | None = None,
        lease_s: float = 60.0,
        agent_executor: RunExecutor | None = None,
    ) -> None:
        self.engine = engine
        self.port = port
        self.executor = executor  # app-side: this process sends the workload to vLLM
        self.agent_executor = agent_executor  # agent-side: the instance's agent runs it (options.executor)
        self.limits = limits or Limits()
        # Several app processes may tick; each experiment is moved on by one (its workload threads
        # live there), holding a lease it renews on every tick.
        self.owner = owner or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self.lease_s = lease_s

    # ------------------------------------------------------------------ entry points
    def tick(self, now: float) -> None:
        for exp in st.claim_experiments(self.engine, self.owner, now, self.lease_s):
            try:
                self._advance_while_ready(exp, now)
            except Exception as exc:  # one broken experiment never stops the others
                log.exception("A/B experiment %s step failed", exp["id"])
                msg = f"internal error in step {exp['step']!r}: {type(exc).__name__}: {exc}"
                if exp["state"] == "restoring":
                    self._finish(exp, now, "failed", msg)
                else:
                    self._fail(exp, now, msg)

    def _advance_while_ready(self, exp: ExperimentRow, now: float) -> None:
        """One step, then the next ones at once while they wait for nothing (starting a switch or a
        run): an experiment does not idle a tick between a healthy rollout and its run, or between
        one run's record and the next run's switch."""
        for _ in range(MAX_STEPS_PER_TICK):
            before = (exp["state"], exp["step"], exp["current_run"])
            self.advance(exp, now)
            nxt = st.get_experiment(self.engine, int(exp["id"]))
            if nxt is None or (nxt["state"], nxt["step"], nxt["current_run"]) == before:
                return  # waiting (a rollout, a run, a busy controller) or gone
            if nxt["state"] != "running" or nxt["step"] not in READY_STEPS:
                return
            exp = nxt

    def advance(self, exp: ExperimentRow, now: float) -> None:
        state = exp["state"]
        if state == "pending":
            self._start(exp, now)
        elif state == "running":
            step = exp["step"]
            if step == "switch":
                self._switch(exp, now)
            elif step == "switching":
                self._switching(exp, now)
            elif step == "run":
                self._run(exp, now)
            elif step == "running":
                self._running(exp, now)
        elif state == "cancelling":
            self._cancelling(exp, now)
        elif state == "restoring":
            self._restoring(exp, now)

    def cancel(self, experiment_id: int, now: float, by: str = "") -> bool:
        """Ask a running experiment to stop; it restores the previous profile on the next ticks."""
        exp = st.get_experiment(self.engine, experiment_id)
        if exp is None or exp["finished_at"] is not None:
            return False
        if exp["state"] == "pending":
            return st.update_experiment(
                self.engine,
                experiment_id,
                now,
                expect_state="pending",
                state="cancelled",
                outcome="cancelled",
                message="cancelled before it started",
                event=f"A/B experiment #{experiment_id} cancelled" + (f" by {by}" if by else ""),
            )
        return st.update_experiment(
            self.engine,
            experiment_id,
            now,
            expect_state="running",
            state="cancelling",
            message="cancelling: stopping the workload, then back to the previous profile",
            event=f"A/B experiment #{experiment_id} cancel requested" + (f" by {by}" if by else ""),
        )

    # ------------------------------------------------------------------ steps
    def _start(self, exp: ExperimentRow, now: float) -> None:
        eid = int(exp["id"])
        try:
            parse_workload(exp["workload"])
        except ValueError as exc:
            self._finish(exp, now, "failed", f"invalid workload: {exc}")
            return
        versions: dict[str, int] = {}
        for arm, name in (("A", exp["profile_a"]), ("B", exp["profile_b"])):
            prof = self.port.profile(str(name))
            if prof is None:
                self._finish(exp, now, "failed", f"arm {arm}: no profile named {name!r}")
                return
            versions[arm] = int(prof["version_id"])
        current = self.port.current(int(exp["instance_id"]))
        prev = int(current["id"]) if current else None
        st.create_runs(self.engine, eid, [(arm, versions[arm]) for arm in plan_runs(int(exp["runs_per_arm"]))])
        st.update_experiment(
            self.engine,
            eid,
            now,
            expect_state="pending",
            state="running",
            step="switch",
            current_run=0,
            version_a_id=versions["A"],
            version_b_id=versions["B"],
            previous_version_id=prev,
            step_started_at=now,
            message=f"starting: {2 * int(exp['runs_per_arm'])} runs, A B A B ...",
            event=f"A/B experiment #{eid} started",
        )

    def _arm_profile(self, exp: ExperimentRow, arm: str) -> str:
        return str(exp["profile_a"] if arm == "A" else exp["profile_b"])

    def _switch(self, exp: ExperimentRow, now: float) -> None:
        eid, iid = int(exp["id"]), int(exp["instance_id"])
        run = st.get_run(self.engine, eid, int(exp["current_run"]))
        if run is None:
            self._fail(exp, now, f"run {exp['current_run']} is missing")
            return
        total = 2 * int(exp["runs_per_arm"])
        label = f"run {run['idx'] + 1}/{total} (arm {run['arm']}, {self._arm_profile(exp, run['arm'])})"
        # Every run, the first included, starts from a restart onto its profile (a rollout even
        # when the instance runs that profile already) and then a cache reset: the same state in
        # both arms, whatever ran before.
        try:
            rid = self.port.request(
                iid,
                self._arm_profile(exp, run["arm"]),
                now,
                requested_by=f"A/B #{eid}",
                override_hybrid=bool((exp.get("options") or {}).get("override_hybrid")),
            )
        except SwitchBusy as exc:
            if now - float(exp["step_started_at"] or now) > self.limits.switch_timeout_s:
                self._fail(exp, now, f"{label}: could not start a rollout: {exc}")
            else:
                st.update_experiment(self.engine, eid, now, expect_step="switch", message=f"{label}: waiting: {exc}")
            return
        except SwitchRefused as exc:
            self._fail(exp, now, f"{label}: the controller refused the switch: {exc}")
            return
        st.update_run(self.engine, int(run["id"]), state="switching", rollout_id=rid)
        st.update_experiment(
            self.engine,
            eid,
            now,
            expect_step="switch",
            step="switching",
            rollout_id=rid,
            step_started_at=now,
            message=f"{label}: switching profile (rollout #{rid})",
        )

    def _switching(self, exp: ExperimentRow, now: float) -> None:
        eid = int(exp["id"])
        run = st.get_run(self.engine, eid, int(exp["current_run"]))
        assert run is not None
        label = f"run {run['idx'] + 1} (arm {run['arm']}, {self._arm_profile(exp, run['arm'])})"
        assert exp["rollout_id"] is not None, "step switching without its rollout"
        rid = int(exp["rollout_id"])
        r = self.port.rollout(rid)
        if r is None:
            self._fail(exp, now, f"{label}: rollout #{rid} vanished")
            return
        if r.get("finished_at") is None:
            if now - float(exp["step_started_at"] or now) > self.limits.switch_timeout_s:
                self._fail(
                    exp,
                    now,
                    f"{label}: rollout #{rid} still {r.get('state')} after {self.limits.switch_timeout_s:.0f} s",
                )
            else:
                st.update_experiment(
                    self.engine, eid, now, expect_step="switching", message=f"{label}: rollout #{rid} {r.get('state')}"
                )
            return
        if r.get("state") != "healthy":
            st.update_run(
                self.engine,
                int(run["id"]),
                state="failed",
                finished_at=now,
                message=f"rollout #{rid} {r.get('state')}: {r.get('message', '')}",
            )
            self._fail(
                exp,
                now,
                f"arm {run['arm']} ({self._arm_profile(exp, run['arm'])}) did not come up: "
                f"rollout #{rid} {r.get('state')}: {r.get('message', '')}".strip(),
            )
            return
        if run["version_id"] is not None and int(r.get("version_id") or -1) != int(run["version_id"]):
            self._fail(
                exp,
                now,
                f"{label}: profile {self._arm_profile(exp, run['arm'])!r} was edited during the "
                "experiment; start a new one to compare the new version",
            )
            return
        argv = [str(a) for a in ((r.get("payload") or {}).get("argv") or [])]
        st.update_run(self.engine, int(run["id"]), argv=argv)
        st.update_experiment(
            self.engine,
            eid,
            now,
            expect_step="switching",
            step="run",
            step_started_at=now,
            message=f"{label}: profile healthy (rollout #{rid})",
        )

    def _run(self, exp: ExperimentRow, now: float) -> None:
        eid = int(exp["id"])
        run = st.get_run(self.engine, eid, int(exp["current_run"]))
        assert run is not None
        spec: WorkloadSpec = parse_workload(exp["workload"])
        key = (eid, int(run["idx"]))
        run_key = f"ab{eid}-s{exp['seed']}-{run['idx']}"
        url = str(exp["instance_url"])
        if not st.update_experiment(
            self.engine,
            eid,
            now,
            expect_state="running",
            expect_step="run",
            step="running",
            step_started_at=now,
            message=f"run {run['idx'] + 1}/{2 * int(exp['runs_per_arm'])} (arm {run['arm']}): {spec.describe()}",
        ):
            return  # cancelled (or moved on) meanwhile
        st.update_run(self.engine, int(run["id"]), state="running", started_at=now)
        self._executor(exp).start(key, url, spec, run_key, self._cancel_check(eid))

    def _executor(self, exp: ExperimentRow) -> RunExecutor:
        if (exp.get("options") or {}).get("executor") == "agent" and self.agent_executor is not None:
            return self.agent_executor
        return self.executor

    def _cancel_check(self, eid: int) -> Any:
        engine = self.engine

        def cancelled() -> bool:
            e = st.get_experiment(engine, eid)
            return e is None or e["state"] != "running"

        return cancelled

    def _running(self, exp: ExperimentRow, now: float) -> None:
        eid = int(exp["id"])
        run = st.get_run(self.engine, eid, int(exp["current_run"]))
        assert run is not None
        key = (eid, int(run["idx"]))
        executor = self._executor(exp)
        record = executor.result(key)
        if record is None:
            if not executor.known(key):
                self._fail(exp, now, f"run {run['idx'] + 1} was lost (the app restarted while it ran)")
            elif now - float(exp["step_started_at"] or now) > self.limits.run_timeout_s:
                self._fail(exp, now, f"run {run['idx'] + 1} took longer than {self.limits.run_timeout_s:.0f} s")
            return
        self._record_run(exp, run, record, now)

    def _record_run(self, exp: ExperimentRow, run: RunRow, record: dict[str, Any], now: float) -> None:
        eid = int(exp["id"])
        spec = parse_workload(exp["workload"])
        record = {
            **record,
            "host_pinned_resident_bytes": host_pinned_bytes(
                self.engine, int(exp["host_id"]), float(run.get("started_at") or now), now
            ),
        }
        summary = summarise_run(record, focus_tags(spec.kind))
        failure = self._run_failure(record, summary)
        state = "cancelled" if record.get("cancelled") else ("failed" if failure else "done")
        dirty = contamination(record, self._plan(exp).get("max_foreign_share", self.limits.max_foreign_share))
        if dirty and state == "done":
            summary["contaminated"] = dirty
        st.update_run(
            self.engine,
            int(run["id"]),
            state=state,
            finished_at=now,
            record=record,
            summary=summary,
            message=failure
            or ("cancelled" if state == "cancelled" else (f"left out of the verdict: {dirty}" if dirty else "ok")),
        )
        if state == "cancelled":
            return  # the cancelling step takes it from here
        if failure:
            self._fail(
                exp,
                now,
                f"arm {run['arm']} ({self._arm_profile(exp, run['arm'])}) failed in run {run['idx'] + 1}: {failure}",
            )
            return
        nxt = int(run["idx"]) + 1
        if nxt < 2 * int(exp["runs_per_arm"]):
            st.update_experiment(
                self.engine,
                eid,
                now,
                expect_step="running",
                step="switch",
                current_run=nxt,
                step_started_at=now,
                message=f"run {nxt} done",
            )
            return
        verdict = self.verdict(exp)
        st.update_experiment(
            self.engine,
            eid,
            now,
            expect_state="running",
            state="restoring",
            step="restore",
            outcome="completed",
            verdict=verdict,
            rollout_id=None,
            step_started_at=now,
            message="all runs done; back to the previous profile",
            event=f"A/B experiment #{eid}: {verdict['call']}",
        )

    def _run_failure(self, record: dict[str, Any], summary: dict[str, Any]) -> str | None:
        if record.get("cancelled"):
            return None
        if not record.get("ok"):
            return str(record.get("error") or "the run failed")
        n, errors = int(summary.get("requests") or 0), int(summary.get("errors") or 0)
        if n and errors / n > self.limits.max_error_rate:
            first = next((r.get("error") for r in record.get("requests") or [] if not r.get("ok")), "")
            return f"{errors} of {n} requests failed ({first})"
        return None

    def _plan(self, exp: ExperimentRow) -> dict[str, Any]:
        """The test fixed when the experiment was created (older experiments: today's defaults)."""
        plan = (exp.get("options") or {}).get("plan")
        if isinstance(plan, dict):
            return plan
        kind = str((exp.get("workload") or {}).get("kind", "probe"))
        return experiment_plan(kind, max_foreign_share=self.limits.max_foreign_share)

    def verdict(self, exp: ExperimentRow) -> dict[str, Any]:
        done = [r for r in st.list_runs(self.engine, int(exp["id"])) if r["state"] == "done"]
        spec = parse_workload(exp["workload"])
        excluded = [
            {"idx": int(r["idx"]), "arm": r["arm"], "reason": (r.get("summary") or {}).get("contaminated")}
            for r in done
            if (r.get("summary") or {}).get("contaminated")
        ]
        left_out = {e["idx"] for e in excluded}
        runs = [r for r in done if int(r["idx"]) not in left_out]
        return compute_verdict(
            spec.kind,
            [r["record"] for r in runs if r["arm"] == "A"],
            [r["record"] for r in runs if r["arm"] == "B"],
            seed=int(exp["seed"]),
            n_boot=self.limits.n_boot,
            profile_a=str(exp["profile_a"]),
            profile_b=str(exp["profile_b"]),
            plan=self._plan(exp),
            excluded=excluded,
        )

    def _cancelling(self, exp: ExperimentRow, now: float) -> None:
        eid = int(exp["id"])
        run = st.get_run(self.engine, eid, int(exp["current_run"]))
        if run is not None and run["state"] == "running":
            key = (eid, int(run["idx"]))
            executor = self._executor(exp)
            record = executor.result(key)
            if record is None and executor.known(key):
                return  # the workload stops at its next request boundary
            if record is not None:
                self._record_run(exp, run, {**record, "cancelled": True}, now)
            else:
                st.update_run(self.engine, int(run["id"]), state="cancelled", finished_at=now, message="cancelled")
        st.update_experiment(
            self.engine,
            eid,
            now,
            expect_state="cancelling",
            state="restoring",
            step="restore",
            outcome="cancelled",
            step_started_at=now,
            rollout_id=exp["rollout_id"] if exp["step"] == "switching" else None,
            message="cancelled; back to the previous profile",
        )

    def _restoring(self, exp: ExperimentRow, now: float) -> None:
        restore.restoring(self, exp, now)

    # ------------------------------------------------------------------ helpers
    def _fail(self, exp: ExperimentRow, now: float, message: str) -> None:
        """End the runs and go back to the previous profile (state restoring, outcome failed)."""
        eid = int(exp["id"])
        st.update_experiment(
            self.engine,
            eid,
            now,
            expect_state=("pending", "running", "cancelling"),
            state="restoring",
            step="restore",
            outcome="failed",
            message=message,
            step_started_at=now,
            rollout_id=exp["rollout_id"] if exp["step"] == "switching" else None,
            event=f"A/B experiment #{eid} failed: {message}",
        )

    def _finish(self, exp: ExperimentRow, now: float, outcome: str, message: str) -> None:
        restore.finish(self, exp, now, outcome, message)


def host_pinned_bytes(engine: Engine, host_id: int, start: float, end: float) -> float | None:
    """The most offload-buffer memory the host's agent saw resident in /dev/shm during the run
    (kvscope:pinned_offload_resident_bytes summed over files; host-wide, so every instance's buffer
    on that host counts). None when the agent sent no such reading."""
    found = read_series(engine, SeriesQuery(["kvscope:pinned_offload_resident_bytes"], start, end, host_id=host_id))
    per_ts: dict[float, float] = {}
    for sp in found:
        for ts, v in sp.points:
            per_ts[ts] = per_ts.get(ts, 0.0) + v
    return max(per_ts.values()) if per_ts else None
