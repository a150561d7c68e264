"""The changes kvscope itself made to instances (rollouts and A/B experiments) overlapping a
span: the rows the alerts' expected windows are made from (app/alerts/expected.py)."""

from __future__ import annotations

from typing import TypedDict

from sqlalchemy import Engine, or_, select

from app.storage.ab_models import AbExperiment
from app.storage.controller_models import ControllerRollout


class ChangeRow(TypedDict):
    kind: str  # rollout | experiment
    id: int
    instance_id: int
    created_at: float
    finished_at: float | None
    label: str  # "kvscope rollout #3", "kvscope A/B experiment #2 (a vs b)"


def _f(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]


def changes_overlapping(engine: Engine, lo: float, now: float, limit: int) -> list[ChangeRow]:
    """Every rollout and experiment created by `now` and not finished before `lo`, newest first
    (at most `limit` of each kind)."""
    r, e = ControllerRollout, AbExperiment
    with engine.connect() as conn:
        rollouts = conn.execute(
            select(r.id, r.instance_id, r.created_at, r.finished_at)
            .where(r.created_at <= now, or_(r.finished_at.is_(None), r.finished_at >= lo))
            .order_by(r.created_at.desc())
            .limit(limit)
        ).all()
        experiments = conn.execute(
            select(e.id, e.instance_id, e.created_at, e.finished_at, e.profile_a, e.profile_b)
            .where(e.created_at <= now, or_(e.finished_at.is_(None), e.finished_at >= lo))
            .order_by(e.created_at.desc())
            .limit(limit)
        ).all()
    out: list[ChangeRow] = [
        ChangeRow(
            kind="rollout",
            id=int(rid),
            instance_id=int(iid),
            created_at=float(created),
            finished_at=_f(finished),
            label=f"kvscope rollout #{rid}",
        )
        for rid, iid, created, finished in rollouts
    ]
    out += [
        ChangeRow(
            kind="experiment",
            id=int(xid),
            instance_id=int(iid),
            created_at=float(created),
            finished_at=_f(finished),
            label=f"kvscope A/B experiment #{xid} ({a} vs {b})",
        )
        for xid, iid, created, finished, a, b in experiments
    ]
    return out
