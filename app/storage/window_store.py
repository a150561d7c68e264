"""Recent raw points of a few metric names across every instance and host at once.

The exporter (app/export/exporter.py) computes per-instance derived series for the app's /metrics from
the last minute or so of samples; one query for the series, one for their points, whatever the
number of instances.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, select

from app.storage.models import SampleRow, Series


@dataclass
class WindowSeries:
    series_id: int
    host_id: int
    instance_id: int | None
    name: str
    labels: dict[str, Any]
    kind: str
    points: list[tuple[float, float]] = field(default_factory=list)  # (ts seconds, value), ascending


def recent_points(engine: Engine, names: Sequence[str], start: float, end: float) -> list[WindowSeries]:
    """Every series named in `names` (instance-level and host-level) with its raw points in
    [start, end]; series without a point there are left out."""
    s = Series.__table__
    lo = int(start * 1000)
    hi = int(end * 1000)
    with engine.connect() as conn:
        meta = {
            int(r[0]): WindowSeries(
                int(r[0]), int(r[1]), None if r[2] is None else int(r[2]), str(r[3]), dict(r[4] or {}), str(r[5])
            )
            for r in conn.execute(
                select(s.c.id, s.c.host_id, s.c.instance_id, s.c.name, s.c.labels, s.c.kind).where(
                    s.c.name.in_(list(names))
                )
            )
        }
        if not meta:
            return []
        q = (
            select(SampleRow.series_id, SampleRow.ts_ms, SampleRow.value)
            .join(s, s.c.id == SampleRow.series_id)
            .where(s.c.name.in_(list(names)), SampleRow.ts_ms >= lo, SampleRow.ts_ms <= hi)
            .order_by(SampleRow.series_id, SampleRow.ts_ms)
        )
        for sid, ts, v in conn.execute(q):
            ws = meta.get(int(sid))
            if ws is not None:
                ws.points.append((ts / 1000.0, float(v)))
    return [ws for ws in meta.values() if ws.points]
