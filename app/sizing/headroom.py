"""Where the host's pinned headroom ends: how large a CPU tier (pinned host RAM) the host can take.

From the agent's host-memory readings (agent/hostmem.py: MemAvailable, the container's cgroup
limit and usage, the shm offload buffers), the latest of the last few minutes:

    free now   = min(MemAvailable, cgroup limit - cgroup usage)
    give back  = the pinned offload buffers resident now (they are freed when vLLM restarts with
                 the new size); for one instance at most its own configured tier
    reserve    = max(2 GiB, 5 % of the limit): the runtime, the OS and neighbours (the same
                 figures as the pinned-memory alert, so a suggestion never trips it)
    headroom   = free now + give back - reserve

Pinned memory is never swapped and counts against the container's limit: over it the engine is
OOM-killed, so the curve stops at the headroom and the suggestion never exceeds it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine

from app.derived.series_reader import SeriesQuery, TieredSeries, read_series

GIB = float(1 << 30)
MAX_AGE_S = 300.0
RESERVE_GIB = 2.0
RESERVE_RATIO = 0.05
HOST_MEMORY = (
    "kvscope:host_memory_available_bytes",
    "kvscope:host_memory_total_bytes",
    "kvscope:cgroup_memory_limit_bytes",
    "kvscope:cgroup_memory_current_bytes",
    "kvscope:pinned_offload_resident_bytes",
)


@dataclass(frozen=True)
class Headroom:
    """Pinned bytes a CPU tier may take on the host; None when the agent sent no host memory."""

    headroom_bytes: float | None
    free_bytes: float | None
    give_back_bytes: float
    reserve_bytes: float
    limit_bytes: float | None
    basis: str

    @property
    def gib(self) -> float | None:
        return None if self.headroom_bytes is None else max(0.0, self.headroom_bytes) / GIB

    def as_dict(self) -> dict[str, object]:
        return {
            "headroom_gib": self.gib,
            "free_gib": None if self.free_bytes is None else self.free_bytes / GIB,
            "give_back_gib": self.give_back_bytes / GIB,
            "reserve_gib": self.reserve_bytes / GIB,
            "limit_gib": None if self.limit_bytes is None else self.limit_bytes / GIB,
            "basis": self.basis,
            "exact": False,
            "why_estimate": "a snapshot of the host's memory now: other processes' use can change",
        }


def _latest(series: Sequence[TieredSeries], now: float) -> float | None:
    """Sum over the series of their value at the latest reading (younger than MAX_AGE_S): a series
    the latest reading lacks is gone (an offload file of a vLLM restarted since), not counted."""
    last: list[tuple[float, float]] = []
    for s in series:
        for t, v in reversed(s.points):
            if t <= now:
                if now - t <= MAX_AGE_S and math.isfinite(v):
                    last.append((t, v))
                break
    if not last:
        return None
    newest = max(t for t, _ in last)
    return sum(v for t, v in last if t >= newest - 1e-6)


def host_readings(engine: Engine, host_id: int, now: float) -> dict[str, float | None]:
    got: dict[str, list[TieredSeries]] = {n: [] for n in HOST_MEMORY}
    for s in read_series(engine, SeriesQuery(list(HOST_MEMORY), now - MAX_AGE_S, now, host_id=host_id)):
        got.setdefault(s.name, []).append(s)
    return {n: _latest(got[n], now) for n in HOST_MEMORY}


def headroom_of(readings: dict[str, float | None], give_back_cap: float | None = None) -> Headroom:
    """The headroom from the readings (pure). give_back_cap: the most of the resident pinned
    buffers that is given back (one instance's configured tier), None for all of them."""
    avail = readings.get("kvscope:host_memory_available_bytes")
    total = readings.get("kvscope:host_memory_total_bytes")
    limit = readings.get("kvscope:cgroup_memory_limit_bytes")
    current = readings.get("kvscope:cgroup_memory_current_bytes")
    candidates: list[tuple[float, float | None, str]] = []
    if avail is not None:
        candidates.append((avail, total, "host MemAvailable"))
    if limit is not None and current is not None and limit > 0:
        candidates.append((max(limit - current, 0.0), limit, "container limit - usage (cgroup)"))
    resident = readings.get("kvscope:pinned_offload_resident_bytes") or 0.0
    give_back = resident if give_back_cap is None else min(resident, max(0.0, give_back_cap))
    if not candidates:
        return Headroom(None, None, give_back, 0.0, None, "the host's agent sent no host memory readings")
    free, size, source = min(candidates, key=lambda c: c[0])
    reserve = max(RESERVE_GIB * GIB, RESERVE_RATIO * (size or 0.0))
    basis = (
        f"{source} {free / GIB:.1f} GiB + pinned offload buffers resident now {give_back / GIB:.1f} GiB "
        f"- reserve {reserve / GIB:.1f} GiB (max of {RESERVE_GIB:g} GiB and {RESERVE_RATIO:.0%} of the limit)"
    )
    return Headroom(free + give_back - reserve, free, give_back, reserve, size, basis)


def host_headroom(engine: Engine, host_id: int, now: float, give_back_cap: float | None = None) -> Headroom:
    return headroom_of(host_readings(engine, host_id, now), give_back_cap)
