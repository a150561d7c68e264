"""Rollouts on the app side: request, hand to the agent, record what it reports, preview.

- request_rollout(): validates the profile, builds the command payload (argv, the last-known-good
  argv, offload facts for the agent's preflight, deadlines, probe parameters) and stores the
  rollout as `requested`;
- command_provider(): on each authenticated push, claims (compare-and-set) the host's requested
  rollouts and returns them as commands; only instances on the pushing agent's host are served;
- push_hook(): every RolloutUpdate of the batch becomes a state change and an event row;
- preview(): the confirm step's argv diff and an app-side preflight from the host's last
  readings (the agent runs the authoritative one before restarting).
"""

from __future__ import annotations

import logging
from typing import Any

from agent import preflight as pf
from agent.preflight_policy import check_flag_policy
from agent.probe import probe_settings_error
from app.context import AppContext
from app.controller.control import record_push
from app.controller.profiles import Profile, ProfileError, argv_diff, parse_profile, policy_limits
from app.derived.series_reader import SeriesQuery, by_name, read_series
from app.storage import rollouts_store as rs
from app.storage.controller_rows import NamedVersionRow, ProfileRow
from app.storage.series_store import InstanceRow, get_instance
from kvcore import flag_policy

log = logging.getLogger("kvscope.rollouts")
EXPIRE_JOB = "rollout_expiry"


class RolloutError(Exception):
    """A rollout that cannot be requested (message for the user; status for the API)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def version_profile(
    version: NamedVersionRow | ProfileRow | None,
    allow_flags: list[str] | None = None,
    limits: flag_policy.Limits | None = None,
) -> Profile | None:
    """The validated profile of a stored version (or a profile's current one); None if it no
    longer validates."""
    if version is None:
        return None
    try:
        return parse_profile(str(version["name"]), dict(version["spec"]), allow_flags=allow_flags or (), limits=limits)
    except ProfileError:
        return None


def build_payload(
    ctx: AppContext,
    profile: Profile,
    version: NamedVersionRow,
    lkg: NamedVersionRow | None,
    *,
    override_hybrid: bool,
    model_root: str | None,
) -> dict[str, Any]:
    s = ctx.settings
    c = s.controller
    lkg_profile = version_profile(lkg, c.allow_flags, policy_limits(s))
    return {
        "profile": {"name": profile.name, "version": version["version"], "version_id": version["id"]},
        "argv": profile.to_argv(),
        # None: the agent falls back to what it last saw healthy (its initial args at first).
        "lkg_argv": lkg_profile.to_argv() if lkg_profile is not None else None,
        "lkg_profile": {"name": lkg["name"], "version": lkg["version"]} if lkg else None,
        "offload": profile.offload_summary(),
        "override_hybrid": override_hybrid,
        "model_root": model_root,
        # The app's defaults: the agent uses them only where the instance's launcher config sets
        # nothing (a per-instance health_deadline_s or probe there wins); a rollout that sets
        # "health_deadline_s" or "probe" itself (top level) wins over both.
        "defaults": {
            "health_deadline_s": c.health_deadline_s,
            "probe": {
                "enabled": c.probe_enabled,
                "prefix_words": c.probe_prefix_words,
                "evict_count": c.probe_evict_count,
                "request_timeout_s": c.probe_request_timeout_s,
            },
        },
    }


def _instance_and_profile(
    ctx: AppContext, instance_id: int, profile_name: str
) -> tuple[InstanceRow, ProfileRow, Profile]:
    """The instance row, the stored profile and its validated model; RolloutError (404/422) if not."""
    inst = get_instance(ctx.engine, instance_id)
    if inst is None:
        raise RolloutError(f"no instance {instance_id}", 404)
    prof = rs.get_profile(ctx.engine, profile_name)
    if prof is None:
        raise RolloutError(f"no profile named {profile_name!r}", 404)
    try:
        profile = parse_profile(
            profile_name,
            prof["spec"],
            allow_flags=ctx.settings.controller.allow_flags,
            limits=policy_limits(ctx.settings),
        )
    except ProfileError as exc:
        raise RolloutError(f"profile {profile_name!r} does not validate any more: {exc}", 422) from None
    return inst, prof, profile


def request_rollout(
    ctx: AppContext,
    instance_id: int,
    profile_name: str,
    *,
    override_hybrid: bool = False,
    requested_by: str = "",
    now: float | None = None,
    probe: dict[str, Any] | None = None,
) -> int:
    now = ctx.now() if now is None else now
    if probe is not None and (why := probe_settings_error(probe)) is not None:
        raise RolloutError(why, 422)
    inst, prof, profile = _instance_and_profile(ctx, instance_id, profile_name)
    version = rs.get_version(ctx.engine, int(prof["version_id"]))
    assert version is not None
    lkg = rs.instance_profiles(ctx.engine, instance_id)["lkg"]
    payload = build_payload(
        ctx, profile, version, lkg, override_hybrid=override_hybrid, model_root=inst.get("model_root")
    )
    if probe:
        payload["probe"] = dict(probe)  # explicit: wins over the launcher config and the defaults
    # The pool before the switch, to show what it changed (e.g. fp8: ~1.8x the tokens).
    payload["pool_before"] = {"kv_cache_size_tokens": (inst.get("cache_config") or {}).get("kv_cache_size_tokens")}
    try:
        return rs.create_rollout(
            ctx.engine,
            instance_id=instance_id,
            version_id=int(version["id"]),
            lkg_version_id=int(lkg["id"]) if lkg else None,
            payload=payload,
            now=now,
            requested_by=requested_by,
            override_hybrid=override_hybrid,
        )
    except rs.StoreConflict as exc:
        raise RolloutError(str(exc), 409) from None


def command_provider(ctx: AppContext) -> Any:
    def provide(host_id: int, agent_id: str, now: float) -> list[dict[str, Any]]:
        # Only the agent that scrapes an instance gets its rollouts (several agents may share a host
        # name); unknown until that agent's first push since the app started: no filter then.
        urls = ctx.agent_urls.get((host_id, agent_id))
        return [
            {"id": c["id"], "kind": "rollout", "instance": c["instance"], "payload": c["payload"]}
            for c in rs.claim_for_host(ctx.engine, host_id, agent_id, now, urls=urls)
        ]

    return provide


def push_hook(ctx: AppContext) -> Any:
    def hook(batch: Any, host_id: int, now: float) -> None:
        scraped = {str(s.instance) for s in getattr(batch, "scrapes", None) or []}
        if scraped:
            known = ctx.agent_urls
            known[(host_id, str(batch.agent_id))] = scraped
            record_push(ctx, host_id, str(batch.agent_id), list(getattr(batch, "controlled", None) or []))
        for u in getattr(batch, "rollout_updates", None) or []:
            ok = rs.apply_update(
                ctx.engine,
                rollout_id=int(u.rollout_id),
                host_id=host_id,
                state=str(u.state),
                ts=float(u.ts),
                message=str(u.message or ""),
                data=dict(u.data or {}),
                now=now,
            )
            if not ok:
                log.info("rollout update ignored: #%s %s from host %s", u.rollout_id, u.state, host_id)

    return hook


def expire_job(ctx: AppContext, now: float) -> None:
    s = ctx.settings.controller
    shortest = min(s.request_ttl_s, s.silent_ttl_s, s.ack_ttl_s)
    for r in rs.stale_rollouts(ctx.engine, updated_before=now - shortest):
        age = now - float(r["updated_at"])
        if r["state"] == "requested" and age >= s.request_ttl_s:
            rs.finish_rollout(
                ctx.engine,
                int(r["id"]),
                "expired",
                f"no agent picked it up in {age:.0f} s (is the host's agent running?)",
                now,
                only_from=("requested",),
            )
        elif r["state"] == "claimed" and age >= s.ack_ttl_s:
            rs.finish_rollout(
                ctx.engine,
                int(r["id"]),
                "expired",
                f"the agent did not acknowledge it in {age:.0f} s: does it control this instance "
                "(`kvscope up -- vllm serve ...`, or --launcher-config listing it)?",
                now,
                only_from=("claimed",),
            )
        elif r["state"] != "requested" and age >= s.silent_ttl_s:
            rs.finish_rollout(
                ctx.engine,
                int(r["id"]),
                "expired",
                f"the agent reported nothing for {age:.0f} s; check the host",
                now,
                only_from=(str(r["state"]),),
            )


# ---------------------------------------------------------------- the confirm step
HOST_READINGS = {
    "mem_total": "kvscope:host_memory_total_bytes",
    "mem_available": "kvscope:host_memory_available_bytes",
    "cgroup_limit": "kvscope:cgroup_memory_limit_bytes",
    "cgroup_current": "kvscope:cgroup_memory_current_bytes",
    "shm_free": "kvscope:dev_shm_free_bytes",
}


def host_memory(ctx: AppContext, host_id: int, now: float, window_s: float = 600.0) -> pf.HostMemory:
    """The host's last memory readings (pushed by its agent), as the preflight reads them."""
    q = SeriesQuery(list(HOST_READINGS.values()), now - window_s, now, host_id=host_id)
    found = by_name(read_series(ctx.engine, q))
    values: dict[str, int | None] = {}
    for key, name in HOST_READINGS.items():
        pts = [p for sp in found.get(name, []) for p in sp.points]
        values[key] = int(max(pts)[1]) if pts else None
    return pf.HostMemory(**values)


def preview(
    ctx: AppContext, instance_id: int, profile_name: str, *, override_hybrid: bool = False, now: float | None = None
) -> dict[str, Any]:
    now = ctx.now() if now is None else now
    inst, prof, profile = _instance_and_profile(ctx, instance_id, profile_name)
    current = rs.instance_profiles(ctx.engine, instance_id)
    cur_profile = version_profile(current["current"], ctx.settings.controller.allow_flags, policy_limits(ctx.settings))
    before = cur_profile.to_argv() if cur_profile else []
    after = profile.to_argv()
    plan = pf.OffloadPlan.from_payload(profile.offload_summary())
    mem = host_memory(ctx, int(inst["host_id"]), now)
    reclaim = cur_profile.pinned_bytes if cur_profile else pf.pinned_bytes_from_argv(before)
    checks = pf.check_memory(plan, mem, reclaim_bytes=reclaim)
    labels = {str(k): str(v) for k, v in (inst.get("cache_config") or {}).items()}
    checks.append(pf.check_hybrid(plan, None, labels, override=override_hybrid))
    checks.append(check_flag_policy(after, before, ctx.settings.controller.allow_flags, policy_limits(ctx.settings)))
    if plan.disk_path:
        checks.append(
            pf.Check(
                "disk_tier",
                "pass",
                f"disk tier {plan.disk_path} ({plan.connector}): the agent checks on the host that it exists or can "
                f"be created and has {pf.gib(plan.disk_min_free_bytes)} free before restarting",
                {"path": plan.disk_path, "min_free_bytes": plan.disk_min_free_bytes},
            )
        )
    return {
        "instance": {"id": inst["id"], "url": inst["url"], "simulated": bool(inst.get("simulated"))},
        "profile": {"name": profile_name, "version": prof["current_version"], "spec": prof["spec"]},
        "current": (
            {"name": current["current"]["name"], "version": current["current"]["version"]}
            if current["current"]
            else None
        ),
        "argv_before": before,
        "argv_after": after,
        "tier_before": cur_profile.tier_label() if cur_profile else "the start-up command's",
        "tier_after": profile.tier_label(),
        "diff": [{"flag": f, "before": a, "after": b} for f, a, b in argv_diff(before, after)],
        "preflight": [c.to_dict() for c in checks],
        "verdict": pf.summarize(checks),
        "note": "preview from the host's last pushed readings; the agent re-checks before restarting",
    }
