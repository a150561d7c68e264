"""Windows in which kvscope itself changed an instance: its rollouts and its A/B experiments.

A rollout restarts vLLM with other flags and an A/B experiment runs a synthetic workload on two
profiles, so hit rates, TTFT and liveness move because kvscope moved them. Alerts that open in
such a window are marked expected (no notification, no banner, shown as expected on /alerts), and
the hit-rate baselines start after the last change (the old configuration is no reference).
A window lasts from the change's creation to its end plus SETTLE_S (caches refill, the probe's
traffic drains); a change still running has no end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from app.storage.change_windows import changes_overlapping

SETTLE_S = 300.0
MAX_WINDOWS = 500  # per evaluation, newest first


@dataclass(frozen=True)
class ExpectedWindow:
    instance_id: int
    start: float
    end: float | None  # when the change finished (None: still running)
    kind: str  # rollout | experiment
    ref: int
    label: str  # "kvscope rollout #3", "kvscope A/B experiment #2 (a vs b)"

    @property
    def quiet_until(self) -> float:
        return math.inf if self.end is None else self.end + SETTLE_S

    def covers(self, t: float) -> bool:
        return self.start <= t <= self.quiet_until

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "ref": self.ref,
            "label": self.label,
            "start": self.start,
            "end": self.end,
            "quiet_until": None if self.end is None else self.quiet_until,
            "instance_id": self.instance_id,
        }


def load_windows(engine: Engine, since: float, now: float) -> dict[int, list[ExpectedWindow]]:
    """Every rollout and experiment that overlaps [since - SETTLE_S, now], by instance."""
    out: dict[int, list[ExpectedWindow]] = {}
    for c in changes_overlapping(engine, since - SETTLE_S, now, MAX_WINDOWS):
        w = ExpectedWindow(c["instance_id"], c["created_at"], c["finished_at"], c["kind"], c["id"], c["label"])
        out.setdefault(c["instance_id"], []).append(w)
    return out


def covering(windows: Sequence[ExpectedWindow], t: float) -> ExpectedWindow | None:
    """The window that covers t (the one that started last), if any."""
    inside = [w for w in windows if w.covers(t)]
    return max(inside, key=lambda w: w.start) if inside else None


def settled_after(windows: Sequence[ExpectedWindow], t: float) -> float | None:
    """When the last change that started at or before t stopped moving the numbers (its end plus
    SETTLE_S); None when no change started by then. inf while one is still running."""
    ends = [w.quiet_until for w in windows if w.start <= t]
    return max(ends) if ends else None


def from_info(info: Mapping[str, Any]) -> Sequence[ExpectedWindow]:
    """The windows the evaluator put in a target's info (key 'kvscope_changes')."""
    got = info.get("kvscope_changes")
    return got if isinstance(got, list | tuple) else ()


def baseline_window(
    info: Mapping[str, Any], first_sample: float | None, now: float, window_s: float, baseline_s: float
) -> tuple[float, float]:
    """A rule's baseline window: the trailing baseline_s before its current window, starting no
    earlier than the target's first sample and after kvscope's last change settled."""
    b1 = now - window_s
    b0 = now - baseline_s
    if first_sample is not None:
        b0 = max(b0, first_sample)
    settled = settled_after(from_info(info), b1)
    if settled is not None and math.isfinite(settled):
        b0 = max(b0, settled)
    return b0, b1
