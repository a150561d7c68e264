"""Sizing checks (app/sizing/checks.py): predictions put to the test, and what was measured."""

from __future__ import annotations

from typing import Any, TypedDict, cast

from sqlalchemy import Engine, Table, insert, select, update

from app.storage.rows import typed_row
from app.storage.sizing_models import SizingCheck

MAX_LISTED = 50


class SizingCheckRow(TypedDict):
    id: int
    instance_id: int
    kind: str
    state: str
    created_at: float
    updated_at: float
    requested_by: str
    experiment_id: int | None
    profile: str
    prediction: dict[str, Any]
    result: dict[str, Any]


def _tbl() -> Table:
    return cast(Table, SizingCheck.__table__)


def create_check(
    engine: Engine,
    *,
    instance_id: int,
    kind: str,
    profile: str,
    prediction: dict[str, Any],
    now: float,
    requested_by: str = "",
    experiment_id: int | None = None,
) -> int:
    with engine.begin() as conn:
        res = conn.execute(
            insert(_tbl()).values(
                instance_id=instance_id,
                kind=kind,
                state="running",
                created_at=now,
                updated_at=now,
                requested_by=requested_by[:200],
                experiment_id=experiment_id,
                profile=profile[:64],
                prediction=prediction,
                result={},
            )
        )
        return int(res.inserted_primary_key[0])  # type: ignore[index]


def finish_check(engine: Engine, check_id: int, state: str, result: dict[str, Any], now: float) -> None:
    with engine.begin() as conn:
        conn.execute(update(_tbl()).where(_tbl().c.id == check_id).values(state=state, result=result, updated_at=now))


def list_checks(engine: Engine, instance_id: int, limit: int = MAX_LISTED) -> list[SizingCheckRow]:
    """The instance's checks, newest first."""
    t = _tbl()
    q = select(t).where(t.c.instance_id == instance_id).order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit)
    with engine.connect() as conn:
        return [typed_row(SizingCheckRow, r._mapping) for r in conn.execute(q)]
