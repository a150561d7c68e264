"""What a rule reads (TargetData) and what it answers (RuleResult, Hint). Plain data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.alerts.series import SeriesMap
from app.storage.events import EventRow


@dataclass(frozen=True)
class Hint:
    """A likely cause, e.g. Hint("workload_shift", "request rate 2.0/s -> 6.1/s (+205%)")."""

    kind: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class RuleResult:
    """active: True (condition holds), False (it does not), None (not enough data to say)."""

    active: bool | None
    value: float | None = None
    baseline: float | None = None
    message: str = ""
    hints: tuple[Hint, ...] = ()
    # Data time at which the condition started, when the rule knows it (e.g. last good scrape).
    since: float | None = None


@dataclass(frozen=True)
class TargetData:
    """Everything a rule may read about one target (an instance, or a host for host rules).

    series: the instance's series (host-level series for a host target);
    host_series: the host-level series (GPU, memory) of the target's host;
    info: the instance row (url, last_scrape, last_ok, healthy, host_last_push, cache_config,
          offload_config ...) or, for a host, {"host": name, "last_push": ..., "instances": [rows]};
    events: event rows (ts, kind, message) of the target in the longest window, newest first.
    """

    series: SeriesMap = field(default_factory=SeriesMap)
    host_series: SeriesMap = field(default_factory=SeriesMap)
    info: Mapping[str, Any] = field(default_factory=dict)
    events: Sequence[EventRow] = ()
