"""The alert state machine, pure: (open alert or None, rule result, now, params) -> decision.

  none --active--> pending --held for_s--> firing --inactive--> resolved
                      \\--inactive--> resolved (never fired: no notification)
An unknown result (not enough data) keeps the state; a firing alert with no data for
nodata_resolve_s resolves. After a resolve, `cooldown_s` must pass before the key opens again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.alerts.rule_io import RuleResult

PENDING = "pending"
FIRING = "firing"
RESOLVED = "resolved"


@dataclass(frozen=True)
class OpenAlert:
    state: str  # pending | firing
    opened_at: float
    since: float
    last_eval: float  # last time the condition was known to hold


@dataclass(frozen=True)
class Decision:
    """action: none | open | update | fire | resolve. For "open", `to_state` is pending or firing
    (for_s already satisfied); `at` is the data time the change takes effect."""

    action: str
    to_state: str | None = None
    at: float | None = None
    reason: str = ""


def decide(
    current: OpenAlert | None,
    result: RuleResult,
    now: float,
    params: Mapping[str, Any],
    *,
    last_resolved_at: float | None = None,
    active_since: float | None = None,
    nodata_resolve_s: float = 900.0,
) -> Decision:
    for_s = float(params.get("for_s", 0.0))
    cooldown_s = float(params.get("cooldown_s", 0.0))
    if current is None:
        if result.active is not True:
            return Decision("none")
        if last_resolved_at is not None and now - last_resolved_at < cooldown_s:
            return Decision("none", reason="cooldown")
        start = min(now, active_since if active_since is not None else now)
        if now - start >= for_s:
            return Decision("open", FIRING, start)
        return Decision("open", PENDING, start)
    if result.active is True:
        if current.state == PENDING and now - current.opened_at >= for_s:
            return Decision("fire", FIRING, now)
        return Decision("update", current.state, now)
    if result.active is False:
        return Decision("resolve", RESOLVED, now, "condition cleared")
    # unknown: hold, unless a firing alert has had no data for too long
    if current.state == FIRING and now - current.last_eval > nodata_resolve_s:
        return Decision("resolve", RESOLVED, now, f"no data for {now - current.last_eval:.0f} s")
    if current.state == PENDING and now - current.last_eval > nodata_resolve_s:
        return Decision("resolve", RESOLVED, now, "no data")
    return Decision("none", reason="no data")
