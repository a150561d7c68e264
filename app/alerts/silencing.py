"""Which silences cover an alert. A silence names a rule, an instance and/or a host; a missing
field matches everything. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def silence_matches(s: Mapping[str, Any], rule: str, instance_id: int | None, host_id: int | None) -> bool:
    if s.get("rule") not in (None, "", rule):
        return False
    if s.get("instance_id") is not None and s.get("instance_id") != instance_id:
        return False
    return not (s.get("host_id") is not None and s.get("host_id") != host_id)


def is_silenced(
    silences: Sequence[Mapping[str, Any]], rule: str, instance_id: int | None, host_id: int | None, now: float
) -> bool:
    return any(float(s.get("until", 0)) > now and silence_matches(s, rule, instance_id, host_id) for s in silences)
