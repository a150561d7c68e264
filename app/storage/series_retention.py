"""Series retention: a series with no raw sample left after the raw retention cut, on an instance
(or host) that still reports, is deleted with its rollups. Run by the rollup job
(app/storage/rollups.py, run_rollups) after it has cut the raw samples.

Without it series were never deleted: a label with unbounded values (or a hostile push) left rows
forever and counted against the per-instance cap (app/storage/series_index.py) for good.

An instance (or a host's agent) that stopped reporting keeps all its series and their rollups:
a server switched off for a weekend must come back with its month of history. Only series that
went quiet while their owner kept pushing (label churn, junk) go. The ingest writer re-checks a
cached series id once the series has been quiet for a while (SERIES_FRESH_MS), so a series that
comes back after deletion gets a new row instead of writing under the deleted id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sqlalchemy import Engine, Table, delete, or_, select

from app.storage.chunk_reads import has_points
from app.storage.models import Host, Instance, Series
from app.storage.rollup_models import Rollup1h, Rollup1m, RollupCarry, RollupLate

CHUNK = 500  # series per delete transaction: pushes get the write lock in between


def delete_idle_series(engine: Engine, series_ids: Sequence[int], raw_cut_ms: int) -> int:
    """Delete the series of `series_ids` that have no raw sample and whose instance (or, for
    host-level series, host) reported at or after `raw_cut_ms`; returns how many went."""
    s = cast(Table, Series.__table__)
    i = cast(Table, Instance.__table__)
    h = cast(Table, Host.__table__)
    cut_s = raw_cut_ms / 1000.0
    deleted = 0
    for start in range(0, len(series_ids), CHUNK):
        chunk = list(series_ids[start : start + CHUNK])
        with engine.begin() as conn:
            # NOT EXISTS: one primary-key seek per series and place (head, open chunk, sealed chunks)
            has_sample = has_points(conn)
            q = (
                select(s.c.id)
                .select_from(s.join(h, h.c.id == s.c.host_id).outerjoin(i, i.c.id == s.c.instance_id))
                .where(
                    s.c.id.in_(chunk),
                    ~has_sample,
                    or_(
                        (s.c.instance_id.is_not(None)) & (i.c.last_scrape >= cut_s),
                        (s.c.instance_id.is_(None)) & (h.c.last_push >= cut_s),
                    ),
                )
            )
            gone = [int(sid) for (sid,) in conn.execute(q)]
            if not gone:
                continue
            for table in (Rollup1m, Rollup1h, RollupCarry, RollupLate):
                conn.execute(delete(table).where(table.series_id.in_(gone)))
            deleted += conn.execute(delete(Series).where(Series.id.in_(gone))).rowcount or 0
    return deleted
