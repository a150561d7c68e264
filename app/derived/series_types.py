"""What a series read returns: the points (raw) or buckets (rollups) of one series from one tier.

Its own module so that the reader (app.derived.series_reader) and the live memo
(app.derived.live), which import each other's pieces, both import it without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.storage.rollup_buckets import Bucket

Point = tuple[float, float]  # (ts seconds, value)


@dataclass(frozen=True)
class TieredSeries:
    """Points of one series from one tier: raw points, or buckets of `res` seconds. host_id and
    instance_id say whose series it is (instance_id None: host-level; both None when not read
    from storage)."""

    series_id: int
    name: str
    labels: dict[str, str]
    kind: str
    tier: str
    res: float
    points: list[Point]  # raw tier only, ascending
    buckets: list[Bucket]  # rollup tiers only, ascending
    host_id: int | None = None
    instance_id: int | None = None
    write_gen: int = 0  # the series' write generation when read (app/storage/series_generation.py)
