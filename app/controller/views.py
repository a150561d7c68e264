"""How profiles and rollouts are shown and saved, shared by the controller's JSON API (api.py)
and its pages (pages.py)."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from app.context import AppContext
from app.controller import rollouts
from app.controller.profiles import ProfileError, parse_profile, policy_limits
from app.storage import rollouts_store as rs
from app.storage.controller_rows import ProfileDetail, RolloutRow
from app.storage.series_store import InstanceRow, get_instance
from kvcore import flag_policy


def policy(ctx: AppContext) -> tuple[list[str], flag_policy.Limits]:
    """The app's flag allow-list widening and its kv-events hosts / tier roots."""
    return ctx.settings.controller.allow_flags, policy_limits(ctx.settings)


def profile_view(
    p: ProfileDetail, allow_flags: list[str] | None = None, limits: flag_policy.Limits | None = None
) -> dict[str, Any]:
    """A profile as the API and the pages show it (a JSON body)."""
    try:
        prof = parse_profile(str(p["name"]), dict(p["spec"]), allow_flags=allow_flags or (), limits=limits)
        argv, error, tier = prof.to_argv(), None, prof.tier_label()
    except ProfileError as exc:
        argv, error, tier = [], str(exc), None
    return {
        "name": p["name"],
        "version": p["current_version"],
        "spec": p["spec"],
        "argv": argv,
        "error": error,
        "tier": tier,
        "updated_at": p["updated_at"],
        "versions": [
            {
                "version": v["version"],
                "spec": v["spec"],
                "created_at": v["created_at"],
                "author": v["author"],
                "note": v["note"],
            }
            for v in p["versions"]
        ],
    }


def rollout_view(r: RolloutRow, inst: InstanceRow | None = None) -> dict[str, Any]:
    """A rollout as the API and the pages show it (a JSON body); with the instance row, the KV
    pool before and now."""
    out: dict[str, Any] = {
        k: r[k]
        for k in (
            "id",
            "instance_id",
            "instance_url",
            "host",
            "profile",
            "profile_version",
            "state",
            "message",
            "requested_by",
            "override_hybrid",
            "created_at",
            "updated_at",
            "claimed_at",
            "claimed_by",
            "finished_at",
        )
    }
    out["terminal"] = r["state"] in rs.TERMINAL_STATES
    payload: dict[str, Any] = r["payload"] or {}
    out["payload"] = payload
    out["result"] = r["result"] or {}
    if inst is not None:
        b = _int((payload.get("pool_before") or {}).get("kv_cache_size_tokens"))
        n = _int((inst["cache_config"] or {}).get("kv_cache_size_tokens"))
        out["pool"] = {"before_tokens": b, "now_tokens": n, "ratio": round(n / b, 3) if b and n else None}
    return out


def _int(v: Any) -> int | None:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return None


def save_profile(
    ctx: AppContext, name: str, spec: dict[str, Any], note: str, *, create: bool, author: str = "api"
) -> JSONResponse:
    try:
        prof = parse_profile(
            name, spec, allow_flags=ctx.settings.controller.allow_flags, limits=policy_limits(ctx.settings)
        )
    except ProfileError as exc:
        raise HTTPException(422, f"invalid profile: {exc}") from None
    try:
        if create:
            p = rs.create_profile(ctx.engine, name, prof.spec(), ctx.now(), author=author, note=note)
        else:
            p = rs.edit_profile(ctx.engine, name, prof.spec(), ctx.now(), author=author, note=note)
    except rs.StoreConflict as exc:
        raise HTTPException(409, str(exc)) from None
    except rs.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    return JSONResponse(profile_view(p, *policy(ctx)), status_code=201 if create else 200)


def request_rollout(ctx: AppContext, instance_id: int, profile: str, override: bool, who: str, probe: Any) -> int:
    if probe is not None and not isinstance(probe, dict):
        raise HTTPException(422, "probe must be an object of probe settings")
    try:
        return rollouts.request_rollout(
            ctx,
            instance_id,
            profile,
            override_hybrid=override,
            requested_by=who,
            probe=probe,
        )
    except rollouts.RolloutError as exc:
        raise HTTPException(exc.status, str(exc)) from None


def stored_rollout(ctx: AppContext, rollout_id: int) -> RolloutRow:
    """The rollout, or 404 (rollouts are never deleted: one just written is there)."""
    ro = rs.get_rollout(ctx.engine, rollout_id)
    if ro is None:
        raise HTTPException(404, f"no rollout {rollout_id}")
    return ro


def rollout_and_instance(ctx: AppContext, rollout_id: int) -> tuple[RolloutRow, InstanceRow | None]:
    ro = stored_rollout(ctx, rollout_id)
    return ro, get_instance(ctx.engine, int(ro["instance_id"]))
