"""The optimal-eviction (Belady) bound beside the LRU curve: how much of the gap to the unbounded
tier is capacity and how much is policy (agent/kvevents/opt_bound.py computes it).

The agent sends it now and then as a snapshot over its last ``opt_accesses`` block accesses, not
as a count over the range: the answer takes the latest window in the range that carries one.
"""

from __future__ import annotations

import math
from typing import Any

from app.storage.sizing_store import SizingWindowRow

GIB = float(1 << 30)
SEMANTICS = (
    "OPT (Belady's MIN with bypass) may hold any block a request referenced and keeps those whose "
    "next lookup comes soonest; unlike vLLM's tier it counts a held block even after a miss earlier in "
    "the request, may decline to store, and may keep GPU-hit blocks of a request that loaded: an upper "
    "bound for every eviction policy at that size, not a policy vLLM runs"
)


def latest_bound(rows: list[SizingWindowRow]) -> tuple[float, int, list[list[float]]] | None:
    """(window end, accesses, rows) of the latest window carrying a bound."""
    for row in reversed(rows):
        counts = row.get("counts") or {}
        pts = counts.get("opt_bound")
        if isinstance(pts, list) and pts:
            good = [
                [float(x) for x in p]
                for p in pts
                if isinstance(p, list)
                and len(p) == 4
                and all(isinstance(x, int | float) and math.isfinite(x) for x in p)
            ]
            acc = counts.get("opt_accesses")
            if good:
                return float(row["end_ts"]), int(acc) if isinstance(acc, int | float) else 0, good
    return None


def optimal_bound(
    found: tuple[float, int, list[list[float]]] | None, block: int, bytes_per_block: float | None, kv_groups: int
) -> dict[str, Any] | None:
    """The bound per size, in tokens and GiB, with the gap to the ceiling split into its two parts."""
    if found is None or not block:
        return None
    at, accesses, pts = found
    groups = max(1, kv_groups)
    points = []
    for chunks, lru, opt, ceiling in sorted(pts):
        blocks = chunks * groups
        gap = ceiling - lru
        points.append(
            {
                "chunks": chunks,
                "offload_gib": blocks * bytes_per_block / GIB if bytes_per_block else None,
                "lru_tokens": lru * block,
                "opt_tokens": opt * block,
                "ceiling_tokens": ceiling * block,
                "policy_tokens": (opt - lru) * block,  # a better eviction order could reload these
                "capacity_tokens": (ceiling - opt) * block,  # no policy of this size can
                "policy_share_of_gap": (opt - lru) / gap if gap > 0 else None,
            }
        )
    return {
        "accesses": accesses,
        "computed_at": at,
        "points": points,
        "exact": False,
        "why": f"computed exactly over the agent's last {accesses:,} block accesses (a window ending at the "
        "push that carried it, replayed from an empty tier), not over the whole range: an estimate for "
        "the range",
        "semantics": SEMANTICS,
    }
