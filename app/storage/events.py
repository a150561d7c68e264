"""Event rows: restarts, config changes, counter resets, rollouts. Charts mark them."""

from __future__ import annotations

from typing import Any, TypedDict, cast

from sqlalchemy import Connection, Engine, Table, insert, select

from app.storage.models import Event
from app.storage.rows import typed_row


class EventRow(TypedDict):
    """One row of `events`, as list_events reads it (and /api/v1/events shows it)."""

    id: int
    ts: float
    host_id: int | None
    instance_id: int | None
    kind: str
    source: str  # agent | app | controller
    message: str
    data: dict[str, Any]  # JSON: what the kind carries (a rollout's state, the changed config ...)


def add_event(
    conn: Connection,
    *,
    ts: float,
    kind: str,
    message: str,
    host_id: int | None = None,
    instance_id: int | None = None,
    source: str = "app",
    data: dict[str, Any] | None = None,
) -> int:
    res = conn.execute(
        insert(Event).values(
            ts=ts,
            kind=kind,
            message=message[:4000],
            host_id=host_id,
            instance_id=instance_id,
            source=source,
            data=data or {},
        )
    )
    pk = res.inserted_primary_key
    return int(pk[0]) if pk else 0


def list_events(
    engine: Engine,
    *,
    instance_id: int | None = None,
    host_id: int | None = None,
    start: float | None = None,
    end: float | None = None,
    kinds: tuple[str, ...] | None = None,
    limit: int = 1000,
) -> list[EventRow]:
    t = cast(Table, Event.__table__)
    q = select(t)
    if instance_id is not None:
        q = q.where(t.c.instance_id == instance_id)
    if host_id is not None:
        q = q.where(t.c.host_id == host_id)
    if start is not None:
        q = q.where(t.c.ts >= start)
    if end is not None:
        q = q.where(t.c.ts <= end)
    if kinds:
        q = q.where(t.c.kind.in_(kinds))
    q = q.order_by(t.c.ts.desc(), t.c.id.desc()).limit(limit)
    with engine.connect() as conn:
        return [typed_row(EventRow, r._mapping) for r in conn.execute(q)]
