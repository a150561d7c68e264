"""PCIe ceilings: usable one-direction bandwidth of a link from its generation and width."""

from __future__ import annotations

# GB/s per lane, one direction, after line encoding (8b/10b for gen 1-2, 128b/130b for gen 3-5,
# FLIT for gen 6).
PER_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def link_ceiling_gbps(gen: float | None, width: float | None) -> float | None:
    """Theoretical one-direction ceiling in GB/s (1e9 bytes), or None when unknown."""
    if gen is None or width is None:
        return None
    g = round(gen)
    if g not in PER_LANE_GBPS or width <= 0:
        return None
    return PER_LANE_GBPS[g] * float(width)
