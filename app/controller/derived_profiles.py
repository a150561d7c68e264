"""Profiles another part derives from an instance's current one (the sizing page's "a tier of this
size" and "KV events on"): the current spec with some fields changed, checked against this app's
flag policy like any submitted profile, saved as a new version only when it differs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.context import AppContext
from app.controller.profiles import parse_profile, policy_limits
from app.storage import rollouts_store as rs

MAX_DESCRIPTION = 2000


def save_derived_profile(
    ctx: AppContext, instance_id: int, name: str, changes: Mapping[str, Any], what: str, *, author: str, note: str
) -> str:
    """Save `name` as the instance's current profile with `changes`, described as the current one
    `what` ("with a 4 GiB CPU offload tier"); returns the name. Raises ProfileError when the
    result breaks the flag policy, rollouts_store.StoreConflict when a concurrent edit won."""
    current = rs.instance_profiles(ctx.engine, instance_id)["current"]
    spec = dict(current["spec"]) if current else {}
    spec.pop("name", None)
    spec.update(changes)
    base = f"profile {current['name']} v{current['version']}" if current else "the start-up command"
    spec["description"] = f"{base} {what}"[:MAX_DESCRIPTION]
    prof = parse_profile(
        name, spec, allow_flags=ctx.settings.controller.allow_flags, limits=policy_limits(ctx.settings)
    )
    existing = rs.get_profile(ctx.engine, name)
    if existing is None:
        rs.create_profile(ctx.engine, name, prof.spec(), ctx.now(), author=author, note=note)
    elif existing.get("spec") != prof.spec():
        rs.edit_profile(ctx.engine, name, prof.spec(), ctx.now(), author=author, note=note)
    return name
