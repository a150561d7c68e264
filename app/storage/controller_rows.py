"""The rows rollouts_store returns: one typed definition per kind of row, so mypy checks the keys
a consumer reads. They stay plain dicts at run time (pages and JSON use them as they are).
JSON columns (spec, payload, result) are dict[str, Any]: their shape is the profile's and the
agent's, not the table's."""

from __future__ import annotations

from typing import Any, TypedDict


class VersionRow(TypedDict):
    """One saved version of a profile (controller_profile_versions)."""

    id: int
    profile_id: int
    version: int
    spec: dict[str, Any]
    created_at: float
    author: str
    note: str


class NamedVersionRow(VersionRow):
    """A version with its profile's name (get_version, instance_profiles)."""

    name: str


class ProfileRow(TypedDict):
    """A profile with its current version's id and spec (list_profiles)."""

    id: int
    name: str
    current_version: int
    created_at: float
    updated_at: float
    version_id: int
    spec: dict[str, Any]


class ProfileDetail(ProfileRow):
    """A profile with every version, newest first (get_profile, create_profile, edit_profile)."""

    versions: list[VersionRow]


class InstanceProfiles(TypedDict):
    """What an instance runs now and its last-known-good profile version (None: not known)."""

    current: NamedVersionRow | None
    lkg: NamedVersionRow | None


class RolloutRow(TypedDict):
    """A rollout with its profile, instance and host (get_rollout, list_rollouts, active_rollout)."""

    id: int
    instance_id: int
    version_id: int
    lkg_version_id: int | None
    state: str
    message: str
    requested_by: str
    override_hybrid: bool
    payload: dict[str, Any]
    result: dict[str, Any]
    created_at: float
    updated_at: float
    claimed_at: float | None
    claimed_by: str | None
    finished_at: float | None
    profile_version: int
    profile: str
    instance_url: str
    host_id: int
    host: str


class ClaimedRollout(TypedDict):
    """A rollout handed to the agent of its host (claim_for_host): the command's id, instance URL
    and payload."""

    id: int
    instance: str
    payload: dict[str, Any]


class StaleRollout(TypedDict):
    """An unfinished rollout with no news for a while (stale_rollouts)."""

    id: int
    state: str
    updated_at: float
