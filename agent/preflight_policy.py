"""Preflight checks of what a rollout command asks for, whatever the app sent:

- `flag_policy`: the new argv and the last-known-good argv the agent would roll back to obey
  kvcore/flag_policy.py (the profile's own flags with their JSON checked key by key, extra flags
  from the allow-list widened by the launcher config's `allow_flags`). A command forged past the
  app is refused here, before anything is restarted.
- `disk_tier`: a disk tier's folder (vLLM's ExampleConnector, LMCache's local disk) is absolute,
  exists or can be created by the agent, and has at least the profile's minimum free space.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.preflight import Check, OffloadPlan, gib, statvfs_free
from kvcore import flag_policy


def check_flag_policy(
    argv: Sequence[str],
    lkg_argv: Sequence[str] | None,
    widen: Sequence[str] = (),
    limits: flag_policy.Limits = flag_policy.DEFAULT_LIMITS,
) -> Check:
    """`limits`: the launcher config's kv_events_allowed_hosts and tier_roots (default loopback
    and flag_policy.DEFAULT_TIER_ROOTS)."""
    allowed = flag_policy.allowed_flags(widen)
    nums = {"allow_flags": list(widen)}
    for what, items in (("the new argv", argv), ("the last-known-good argv", lkg_argv or [])):
        why = flag_policy.refusal(list(items), allowed=allowed, fields=True, limits=limits)
        if why is not None:
            return Check("flag_policy", "refuse", f"{what}: {why}", {**nums, "argv": list(items)})
    return Check("flag_policy", "pass", "every flag is a profile field or on the allow-list", nums)


def check_disk_tier(plan: OffloadPlan, *, free: Callable[[Path], int | None] = statvfs_free) -> Check | None:
    if not plan.enabled or not plan.disk_path:
        return None
    path = Path(plan.disk_path)
    nums: dict[str, object] = {"path": plan.disk_path, "min_free_bytes": plan.disk_min_free_bytes}
    if not path.is_absolute():
        return Check("disk_tier", "refuse", f"disk tier folder {path} is not an absolute path", nums)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing != path and not existing.is_dir():
        return Check("disk_tier", "refuse", f"disk tier folder {path}: {existing} is not a folder", nums)
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created ({existing} is not writable)"
        return Check("disk_tier", "refuse", f"disk tier folder {path} {what} by the agent", nums)
    if existing == path and not path.is_dir():
        return Check("disk_tier", "refuse", f"disk tier path {path} is not a folder", nums)
    room = free(existing)
    nums["free_bytes"] = room
    if room is None:
        return Check("disk_tier", "warn", f"disk tier {path}: free space unknown", nums)
    if room < plan.disk_min_free_bytes:
        return Check(
            "disk_tier",
            "refuse",
            f"disk tier {path}: {gib(room)} free < the profile's minimum {gib(plan.disk_min_free_bytes)}",
            nums,
        )
    created = "" if existing == path else f" (to be created under {existing})"
    grows = " vLLM's ExampleConnector never deletes: watch it grow" if plan.connector == "ExampleConnector" else ""
    return Check("disk_tier", "pass", f"disk tier {path}{created}: {gib(room)} free.{grows}", nums)
