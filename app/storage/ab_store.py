"""A/B experiments and runs: their SQL, and only here.

State changes are compare-and-set on the experiment's state (and step), so two schedulers (or a
cancel racing a tick) cannot both move one experiment.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Engine, Row, Table, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from app.storage.ab_models import AbExperiment, AbRun
from app.storage.ab_rows import ExperimentRow, RunRow
from app.storage.events import add_event
from app.storage.models import Host, Instance
from app.storage.rows import typed_row

FINISHED_STATES = frozenset({"completed", "failed", "cancelled"})

_E = cast(Table, AbExperiment.__table__)
_R = cast(Table, AbRun.__table__)
_I = cast(Table, Instance.__table__)
_H = cast(Table, Host.__table__)


class ExperimentConflict(Exception):
    """The instance already has an experiment in progress."""


def create_experiment(
    engine: Engine,
    *,
    instance_id: int,
    profile_a: str,
    profile_b: str,
    workload: dict[str, Any],
    runs_per_arm: int,
    seed: int,
    now: float,
    requested_by: str = "",
    options: dict[str, Any] | None = None,
) -> int:
    try:
        with engine.begin() as conn:
            res = conn.execute(
                insert(_E).values(
                    instance_id=instance_id,
                    profile_a=profile_a,
                    profile_b=profile_b,
                    workload=workload,
                    options=options or {},
                    runs_per_arm=runs_per_arm,
                    seed=seed,
                    state="pending",
                    step="",
                    current_run=0,
                    message="waiting to start",
                    verdict={},
                    requested_by=requested_by,
                    created_at=now,
                    updated_at=now,
                )
            )
            pk = res.inserted_primary_key
            assert pk is not None
            eid = int(pk[0])
            _event(
                conn,
                eid,
                instance_id,
                now,
                f"A/B experiment #{eid} requested: {profile_a} vs {profile_b}"
                + (f" by {requested_by}" if requested_by else ""),
            )
    except IntegrityError:
        raise ExperimentConflict(
            f"instance {instance_id} has an A/B experiment in progress; wait for it or cancel it"
        ) from None
    return eid


def _event(conn: Any, eid: int, instance_id: int, now: float, message: str) -> None:
    host_id = conn.execute(select(_I.c.host_id).where(_I.c.id == instance_id)).scalar_one_or_none()
    add_event(
        conn,
        ts=now,
        kind="ab",
        host_id=host_id,
        instance_id=instance_id,
        source="app",
        message=message,
        data={"experiment_id": eid},
    )


def _query() -> Any:
    return (
        select(
            _E,
            _I.c.url.label("instance_url"),
            _I.c.host_id.label("host_id"),
            _H.c.name.label("host"),
            _I.c.simulated.label("simulated"),
        )
        .join(_I, _I.c.id == _E.c.instance_id)
        .join(_H, _H.c.id == _I.c.host_id)
    )


def _experiment(row: Row[Any]) -> ExperimentRow:
    return typed_row(ExperimentRow, row._mapping)


def _run(row: Row[Any]) -> RunRow:
    return typed_row(RunRow, row._mapping)


def get_experiment(engine: Engine, experiment_id: int) -> ExperimentRow | None:
    with engine.connect() as conn:
        row = conn.execute(_query().where(_E.c.id == experiment_id)).first()
    return _experiment(row) if row else None


def list_experiments(engine: Engine, *, instance_id: int | None = None, limit: int = 100) -> list[ExperimentRow]:
    q = _query()
    if instance_id is not None:
        q = q.where(_E.c.instance_id == instance_id)
    q = q.order_by(_E.c.created_at.desc(), _E.c.id.desc()).limit(limit)
    with engine.connect() as conn:
        return [_experiment(r) for r in conn.execute(q)]


def unfinished_experiments(engine: Engine) -> list[ExperimentRow]:
    with engine.connect() as conn:
        return [_experiment(r) for r in conn.execute(_query().where(_E.c.finished_at.is_(None)).order_by(_E.c.id))]


def claim_experiments(engine: Engine, owner: str, now: float, lease_s: float) -> list[ExperimentRow]:
    """The unfinished experiments this process moves on now: those it owns (lease renewed), plus
    unowned ones and those whose owner's lease ran out (taken over by compare-and-set)."""
    with engine.begin() as conn:
        conn.execute(
            update(_E)
            .where(_E.c.finished_at.is_(None))
            .where(or_(_E.c.owner.is_(None), _E.c.owner == owner, _E.c.lease_until < now))
            .values(owner=owner, lease_until=now + lease_s)
        )
    with engine.connect() as conn:
        return [
            _experiment(r)
            for r in conn.execute(_query().where(_E.c.finished_at.is_(None), _E.c.owner == owner).order_by(_E.c.id))
        ]


def update_experiment(
    engine: Engine,
    experiment_id: int,
    now: float,
    *,
    expect_state: str | tuple[str, ...] | None = None,
    expect_step: str | None = None,
    event: str | None = None,
    **values: Any,
) -> bool:
    """Set fields; with expect_state/expect_step only if the row is still there (CAS). Finishing
    states set finished_at. `event` adds an event row in the same transaction."""
    values["updated_at"] = now
    if values.get("state") in FINISHED_STATES:
        values.setdefault("finished_at", now)
    q = update(_E).where(_E.c.id == experiment_id, _E.c.finished_at.is_(None))
    if expect_state is not None:
        states = (expect_state,) if isinstance(expect_state, str) else expect_state
        q = q.where(_E.c.state.in_(states))
    if expect_step is not None:
        q = q.where(_E.c.step == expect_step)
    with engine.begin() as conn:
        res = conn.execute(q.values(**values))
        if res.rowcount != 1:
            return False
        if event:
            iid = conn.execute(select(_E.c.instance_id).where(_E.c.id == experiment_id)).scalar_one()
            _event(conn, experiment_id, int(iid), now, event)
    return True


MAX_NOTES = 20
MAX_NOTE_CHARS = 500


def add_note(engine: Engine, experiment_id: int, note: str, now: float) -> bool:
    """Append a note to an experiment (options.notes, shown on its page), e.g. the demo pausing its
    traffic generator. At most MAX_NOTES, each cut to MAX_NOTE_CHARS; the same note twice is kept once."""
    note = note.strip()[:MAX_NOTE_CHARS]
    with engine.begin() as conn:
        row = conn.execute(select(_E.c.options).where(_E.c.id == experiment_id)).first()
        if row is None or not note:
            return False
        options = dict(row[0] or {})
        notes = [str(n) for n in options.get("notes") or []]
        if note in notes:
            return True
        if len(notes) >= MAX_NOTES:
            return False
        options["notes"] = [*notes, note]
        conn.execute(update(_E).where(_E.c.id == experiment_id).values(options=options, updated_at=now))
        _event(conn, experiment_id, _instance_of(conn, experiment_id), now, f"A/B experiment #{experiment_id}: {note}")
    return True


def _instance_of(conn: Any, experiment_id: int) -> int:
    return int(conn.execute(select(_E.c.instance_id).where(_E.c.id == experiment_id)).scalar_one())


# ---------------------------------------------------------------- runs
def create_runs(engine: Engine, experiment_id: int, plan: list[tuple[str, int | None]]) -> None:
    """plan: (arm, profile version id) in run order."""
    with engine.begin() as conn:
        for idx, (arm, version_id) in enumerate(plan):
            conn.execute(
                insert(_R).values(
                    experiment_id=experiment_id,
                    idx=idx,
                    arm=arm,
                    version_id=version_id,
                    state="pending",
                    argv=[],
                    record={},
                    summary={},
                    message="",
                )
            )


def list_runs(engine: Engine, experiment_id: int) -> list[RunRow]:
    with engine.connect() as conn:
        return [_run(r) for r in conn.execute(select(_R).where(_R.c.experiment_id == experiment_id).order_by(_R.c.idx))]


def get_run(engine: Engine, experiment_id: int, idx: int) -> RunRow | None:
    with engine.connect() as conn:
        row = conn.execute(select(_R).where(_R.c.experiment_id == experiment_id, _R.c.idx == idx)).first()
    return _run(row) if row else None


def update_run(engine: Engine, run_id: int, *, expect_state: str | None = None, **values: Any) -> bool:
    q = update(_R).where(_R.c.id == run_id)
    if expect_state is not None:
        q = q.where(_R.c.state == expect_state)
    with engine.begin() as conn:
        return bool(conn.execute(q.values(**values)).rowcount == 1)
