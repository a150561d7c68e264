"""Several instances on one host: the split of the host's pinned headroom that saves the most.

Greedy by marginal gain per GiB (pure): every instance's curve is taken as its upper concave hull
(app/sizing/levers.py), whose segments have falling slopes; taking the steepest segment of any
instance first, until the headroom is spent or no segment pays the price, is optimal for concave
curves (a fractional knapsack). The gain is prefill seconds where every instance has vLLM's
prefill cost, else tokens not recomputed (and it says which).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.sizing.levers import Hull, on_hull


@dataclass(frozen=True)
class Candidate:
    instance_id: int
    url: str
    hull: Hull  # GiB -> tokens not recomputed
    value_per_token: float | None  # prefill seconds saved per reloaded token (None: unknown)
    price_tokens_per_gib: float  # a GiB must save this many tokens to be worth pinning
    current_gib: float


def split(cands: list[Candidate], budget_gib: float | None) -> dict[str, Any]:
    seconds = bool(cands) and all(c.value_per_token is not None for c in cands)
    unit = "prefill seconds" if seconds else "prompt tokens"
    segs: list[tuple[float, int, int, float, float]] = []  # (-value per GiB, order, idx, x0, x1)
    for idx, c in enumerate(cands):
        k = c.value_per_token if seconds and c.value_per_token is not None else 1.0
        for order, (x0, x1, slope) in enumerate(c.hull.segments()):
            if slope >= c.price_tokens_per_gib and slope > 0:
                segs.append((-slope * k, order, idx, x0, x1))
    segs.sort()
    give = [0.0] * len(cands)
    left = budget_gib
    for _neg, _order, idx, x0, x1 in segs:
        if left is not None and left <= 1e-9:
            break
        if abs(give[idx] - x0) > 1e-9:
            continue  # an instance's segments are taken in order (their slopes fall)
        width = x1 - x0 if left is None else min(x1 - x0, left)
        give[idx] += width
        if left is not None:
            left -= width
    rows: list[dict[str, Any]] = []
    for c, gib in zip(cands, give, strict=True):
        tokens = on_hull(c.hull, gib)
        rows.append(
            {
                "instance_id": c.instance_id,
                "instance": c.url,
                "offload_gib": round(gib, 2),
                "current_gib": c.current_gib,
                "reload_tokens": tokens,
                "saved_prefill_s": tokens * c.value_per_token if c.value_per_token is not None else None,
            }
        )
    total = sum(float((r["saved_prefill_s"] or 0.0) if seconds else r["reload_tokens"]) for r in rows)
    return {
        "budget_gib": budget_gib,
        "unit": unit,
        "instances": rows,
        "total_saved": total,
        "used_gib": sum(give),
        "method": "greedy by marginal gain per GiB over each instance's concave hull (optimal for concave "
        f"curves), gain in {unit}; a GiB is given only where it pays the price",
        "exact": False,
        "why_estimate": "each instance's curve is its own past traffic; the headroom is a snapshot",
    }
