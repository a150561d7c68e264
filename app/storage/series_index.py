"""Series ids for the ingest writer: cached per (host, instance), looked up and created in bulk,
with the cardinality caps.

A push whose series are all known costs one dict lookup per sample. Unknown (or long-unseen)
series of an instance are resolved together: one SELECT of the instance's series through the
unique identity index (host_id, coalesce(instance_id, 0), name, labels_key), one multi-row INSERT
of the new ones (conflicts from another app process ignored), one SELECT of their ids. The old
path ran a SELECT that could not use that index (it scanned every series of the same name) plus a
SAVEPOINT + INSERT for each new series: one push creating 8,000 series took tens of seconds with
SQLite's write lock held.

A cached id is trusted only while the series was written recently (SeriesLimits.fresh_ms, less
than the raw retention): the retention job deletes series without raw samples (app/storage/series_retention.py),
possibly from another process, and a series back after that must get a new row, not a dead id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, Table, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite

from app.storage import chunk_reads
from app.storage.models import Series

LabelItems = tuple[tuple[str, str], ...]
SeriesKey = tuple[str, LabelItems]  # (name, sorted label items)
Scope = tuple[int, int | None]  # (host id, instance id or None for host-level series)

# Defaults sized from real vLLM exporters (tests/fixtures and /work/shared/fixtures/vllm): one
# engine exposes 330-411 series after the agent's normalisation; data-parallel engines, LoRA
# adapters and newer builds multiply that to a few thousand. 10,000 per instance leaves 3x margin
# over a DP=8 server; 20,000 new per push lets one agent bring several such servers at once.
DEFAULT_MAX_SERIES_PER_INSTANCE = 10_000
DEFAULT_MAX_NEW_SERIES_PER_PUSH = 20_000
IN_CHUNK = 500  # ids per IN (...) list: well under every driver's bind limit


@dataclass(frozen=True)
class SeriesLimits:
    per_instance: int = DEFAULT_MAX_SERIES_PER_INSTANCE
    new_per_push: int = DEFAULT_MAX_NEW_SERIES_PER_PUSH
    instances_per_host: int = 64  # distinct vLLM instance URLs one host may have
    # a cached id is trusted this long after the series' last sample: well under the raw
    # retention, after which the retention job may delete a quiet series
    fresh_ms: int = 12 * 3600 * 1000


class SeriesCapExceeded(ValueError):
    """A push over a series cap: nothing of it is stored (the caller answers 422)."""


def labels_key(labels: Mapping[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def scope_name(iid: int | None, url: str | None) -> str:
    return f"instance {url}" if iid is not None else "host-level series of this host"


class SeriesIndex:
    """Series ids by scope. Entries are [series id, kind, last written ts_ms] (mutable: the
    writer moves the timestamp on every sample)."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.scopes: dict[Scope, dict[SeriesKey, list[Any]]] = {}

    def clear(self) -> None:
        self.scopes.clear()

    def scope(self, key: Scope) -> dict[SeriesKey, list[Any]]:
        got = self.scopes.get(key)
        if got is None:
            got = self.scopes[key] = {}
        return got

    def load(self, conn: Connection, key: Scope) -> dict[tuple[str, str], tuple[int, str]]:
        """Every stored series of a scope by (name, labels_key): one indexed SELECT."""
        host_id, iid = key
        t = cast(Table, Series.__table__)
        q = select(t.c.id, t.c.name, t.c.labels_key, t.c.kind).where(
            t.c.host_id == host_id, func.coalesce(t.c.instance_id, 0) == (iid or 0)
        )
        return {(str(n), str(lk)): (int(sid), str(kind)) for sid, n, lk, kind in conn.execute(q)}

    def create(self, conn: Connection, key: Scope, new: Iterable[tuple[str, str, dict[str, str], str]]) -> None:
        """INSERT the (name, labels_key, labels, kind) rows in one statement; rows another process
        created meanwhile are skipped (the caller reloads the ids)."""
        host_id, iid = key
        rows = [
            {"host_id": host_id, "instance_id": iid, "name": n, "labels_key": lk, "labels": lab, "kind": kind}
            for n, lk, lab, kind in new
        ]
        if not rows:
            return
        if self.dialect == "postgresql":
            stmt: Any = postgresql.insert(Series).on_conflict_do_nothing()
        elif self.dialect == "sqlite":
            stmt = sqlite.insert(Series).on_conflict_do_nothing()
        else:
            stmt = insert(Series)
        conn.execute(stmt, rows)


def last_values(conn: Connection, series_ids: list[int]) -> dict[int, float]:
    """The newest stored value of each series (counter reset detection after a restart): the
    head's newest row or the end of the series' last chunk (app.storage.chunk_reads)."""
    return {sid: v for sid, (_, v) in chunk_reads.last_points(conn, series_ids).items()}
