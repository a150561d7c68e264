"""What the A/B JSON API (api.py) and pages (pages.py) share: the app's orchestrator, and
loading, starting and keeping an experiment with the HTTP error that says why not."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException

from app.ab import service
from app.ab.agent_executor import AgentExecutor
from app.ab.orchestrator import Limits, Orchestrator
from app.ab.ports import RolloutsPort, ThreadExecutor
from app.context import AppContext
from app.storage import ab_store as st
from app.storage.ab_rows import ExperimentRow, RunRow
from app.storage.controller_rows import NamedVersionRow, ProfileRow

# Workload runs at once (app-side threads): one per arm of two experiments; each run loads a
# vLLM server, so more would measure the runs' contention, not the profiles
WORKERS = 2


def build_orchestrator(ctx: AppContext) -> Orchestrator:
    limits = Limits(n_boot=ctx.settings.ab.bootstrap_resamples)
    return Orchestrator(
        ctx.engine,
        RolloutsPort(ctx),
        ThreadExecutor(max_workers=WORKERS),
        limits,
        agent_executor=AgentExecutor(ctx.engine),
    )


def orchestrator(ctx: AppContext) -> Orchestrator:
    orch = ctx.peek_state(Orchestrator)
    if orch is None:
        orch = build_orchestrator(ctx)
        ctx.set_state(orch)
    return orch


def tick_job(ctx: AppContext, now: float) -> None:
    orchestrator(ctx).tick(now)


def arm_tier(ctx: AppContext, version_id: Any, name: Any = None) -> str:
    """The KV tier of an arm's profile version, in words (e.g. 'disk tier /var/kv (ExampleConnector)');
    before the experiment pins a version, the profile's current one."""
    from app.controller.profiles import policy_limits
    from app.controller.rollouts import version_profile
    from app.storage.rollouts_store import get_profile, get_version

    version: NamedVersionRow | ProfileRow | None
    try:
        version = get_version(ctx.engine, int(version_id)) if version_id is not None else None
    except (TypeError, ValueError, OverflowError):
        version = None
    if version is None and name:
        version = get_profile(ctx.engine, str(name))
    prof = version_profile(version, ctx.settings.controller.allow_flags, policy_limits(ctx.settings))
    return prof.tier_label() if prof is not None else "unknown (profile not found or no longer valid)"


def load_or_http(ctx: AppContext, experiment_id: int) -> tuple[ExperimentRow, list[RunRow]]:
    """The experiment and its runs, or the HTTP error that says why not."""
    try:
        return service.load(ctx, experiment_id)
    except service.ExperimentError as exc:
        raise http_error(exc) from None


def http_error(exc: service.ExperimentError) -> HTTPException:
    return HTTPException(exc.status, str(exc))


def whole_number(v: Any, what: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise HTTPException(422, f"{what} must be a whole number") from None


def start_from(ctx: AppContext, body: dict[str, Any], who: str) -> int:
    try:
        return service.start_experiment(
            ctx,
            instance_id=whole_number(body.get("instance"), "instance"),
            profile_b=str(body.get("b") or ""),
            profile_a=str(body.get("a") or "") or None,
            workload=body.get("workload") or {"kind": "probe"},
            runs_per_arm=whole_number(body.get("runs", 3), "runs"),
            seed=whole_number(body.get("seed", 0), "seed"),
            override_hybrid=bool(body.get("override_hybrid")),
            requested_by=who,
            executor=str(body.get("executor") or "auto"),
        )
    except service.ExperimentError as exc:
        raise http_error(exc) from None


def keep_arm(ctx: AppContext, experiment_id: int, arm: str, who: str) -> int:
    from app.controller.rollouts import RolloutError, request_rollout

    exp = st.get_experiment(ctx.engine, experiment_id)
    if exp is None:
        raise HTTPException(404, f"no experiment {experiment_id}")
    if exp["finished_at"] is None:
        raise HTTPException(409, "the experiment is still running; wait for it to finish (or cancel it)")
    if arm not in ("A", "B"):
        raise HTTPException(422, "arm must be A or B")
    name = str(exp["profile_a"] if arm == "A" else exp["profile_b"])
    try:
        return request_rollout(
            ctx,
            int(exp["instance_id"]),
            name,
            requested_by=f"{who} (keep {arm} of A/B #{experiment_id})",
            override_hybrid=bool((exp.get("options") or {}).get("override_hybrid")) and arm == "B",
        )
    except RolloutError as exc:
        raise HTTPException(exc.status, str(exc)) from None
