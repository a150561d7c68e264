"""SQL of the alerts: episodes with compare-and-set transitions, history, deliveries, silences,
per-instance overrides. Every state change and the deliveries it causes commit in one
transaction, and only the process whose CAS succeeded writes them: two app processes never
notify twice."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Row, and_, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from app.storage.alert_models import Alert, AlertDelivery, AlertOverride, AlertSilence, AlertTransition
from app.storage.alert_rows import AlertRow, AlertTransitionRow, DeliveryRow, SilenceRow
from app.storage.models import Host, Instance
from app.storage.rows import typed_row

A = Alert.__table__
T = AlertTransition.__table__
D = AlertDelivery.__table__
S = AlertSilence.__table__
O = AlertOverride.__table__  # noqa: E741


@dataclass(frozen=True)
class TransitionRow:
    from_state: str | None
    to_state: str
    ts: float
    value: float | None = None
    message: str = ""


@dataclass(frozen=True)
class NewDelivery:
    channel: str
    event: str  # firing | resolved | refresh | test
    payload: dict[str, Any]


def _insert_transitions(conn: Connection, alert_id: int, transitions: Sequence[TransitionRow]) -> None:
    for tr in transitions:
        conn.execute(
            insert(AlertTransition).values(
                alert_id=alert_id,
                ts=tr.ts,
                from_state=tr.from_state,
                to_state=tr.to_state,
                value=tr.value,
                message=tr.message[:4000],
            )
        )


def _insert_deliveries(
    conn: Connection, alert_id: int | None, deliveries: Sequence[NewDelivery], now: float
) -> list[int]:
    ids: list[int] = []
    for d in deliveries:
        res = conn.execute(
            insert(AlertDelivery).values(
                alert_id=alert_id,
                channel=d.channel,
                event=d.event,
                status="pending",
                attempts=0,
                created_at=now,
                next_attempt_at=now,
                payload=d.payload,
            )
        )
        pk = res.inserted_primary_key
        ids.append(int(pk[0]) if pk else 0)
    return ids


# ------------------------------------------------------------------ episodes
def _alert(row: Row[Any]) -> AlertRow:
    return typed_row(AlertRow, row._mapping)


def _delivery(row: Row[Any]) -> DeliveryRow:
    return typed_row(DeliveryRow, row._mapping)


def open_alerts(engine: Engine) -> dict[str, AlertRow]:
    """Open (pending or firing) alerts by key."""
    with engine.connect() as conn:
        rows = conn.execute(_alert_query().where(A.c.active_key.is_not(None))).all()
    return {str(r.key): _alert(r) for r in rows}


def last_resolved(engine: Engine) -> dict[str, float]:
    """The latest resolve time per key (for cooldowns)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(A.c.key, func.max(A.c.resolved_at)).where(A.c.resolved_at.is_not(None)).group_by(A.c.key)
        ).all()
    return {str(k): float(v) for k, v in rows if v is not None}


def open_alert(
    engine: Engine,
    values: dict[str, Any],
    transitions: Sequence[TransitionRow],
    deliveries: Sequence[NewDelivery],
    now: float,
) -> int | None:
    """Insert a new open alert (values must include key, rule, state ...). None when another
    process opened the same key first (unique active_key)."""
    try:
        with engine.begin() as conn:
            res = conn.execute(insert(Alert).values(active_key=values["key"], version=1, **values))
            pk = res.inserted_primary_key
            alert_id = int(pk[0]) if pk else 0
            _insert_transitions(conn, alert_id, transitions)
            if deliveries:
                payloads = [NewDelivery(d.channel, d.event, {**d.payload, "id": alert_id}) for d in deliveries]
                _insert_deliveries(conn, alert_id, payloads, now)
            return alert_id
    except IntegrityError:
        return None


def cas_update(
    engine: Engine,
    alert_id: int,
    version: int,
    values: dict[str, Any],
    transitions: Sequence[TransitionRow] = (),
    deliveries: Sequence[NewDelivery] = (),
    now: float = 0.0,
) -> bool:
    """Apply `values` if the row is still at `version`; then write its transitions and deliveries.
    False (nothing written) when another process changed the alert first."""
    with engine.begin() as conn:
        res = conn.execute(
            update(Alert).where(Alert.id == alert_id, Alert.version == version).values(version=version + 1, **values)
        )
        if res.rowcount != 1:
            return False
        _insert_transitions(conn, alert_id, transitions)
        _insert_deliveries(conn, alert_id, deliveries, now)
    return True


def _alert_query() -> Any:
    i = Instance.__table__
    h = Host.__table__
    return (
        select(
            A,
            i.c.url.label("instance_url"),
            i.c.model.label("model"),
            i.c.simulated.label("simulated"),
            h.c.name.label("host"),
        )
        .outerjoin(i, i.c.id == A.c.instance_id)
        .outerjoin(h, h.c.id == A.c.host_id)
    )


def list_alerts(
    engine: Engine,
    *,
    states: Sequence[str] | None = None,
    instance_id: int | None = None,
    rule: str | None = None,
    limit: int = 200,
) -> list[AlertRow]:
    q = _alert_query()
    if states:
        q = q.where(A.c.state.in_(list(states)))
    if instance_id is not None:
        q = q.where(A.c.instance_id == instance_id)
    if rule is not None:
        q = q.where(A.c.rule == rule)
    q = q.order_by(A.c.since.desc(), A.c.id.desc()).limit(limit)
    with engine.connect() as conn:
        return [_alert(r) for r in conn.execute(q)]


def get_alert(engine: Engine, alert_id: int) -> AlertRow | None:
    with engine.connect() as conn:
        row = conn.execute(_alert_query().where(A.c.id == alert_id)).first()
    return _alert(row) if row else None


def list_transitions(engine: Engine, *, alert_id: int | None = None, limit: int = 200) -> list[AlertTransitionRow]:
    i = Instance.__table__
    h = Host.__table__
    q = (
        select(T, A.c.rule, A.c.key, A.c.instance_id, i.c.url.label("instance_url"), h.c.name.label("host"))
        .join(A, A.c.id == T.c.alert_id)
        .outerjoin(i, i.c.id == A.c.instance_id)
        .outerjoin(h, h.c.id == A.c.host_id)
    )
    if alert_id is not None:
        q = q.where(T.c.alert_id == alert_id)
    q = q.order_by(T.c.ts.desc(), T.c.id.desc()).limit(limit)
    with engine.connect() as conn:
        return [typed_row(AlertTransitionRow, r._mapping) for r in conn.execute(q)]


def acknowledge(engine: Engine, alert_id: int, now: float, note: str = "") -> bool:
    with engine.begin() as conn:
        res = conn.execute(
            update(Alert)
            .where(Alert.id == alert_id, Alert.acked_at.is_(None))
            .values(acked_at=now, ack_note=note[:1000], version=Alert.version + 1)
        )
        return res.rowcount == 1


def prune(engine: Engine, before: float) -> int:
    """Delete alerts resolved before `before` (their transitions and deliveries go with them) and
    old test deliveries. Returns the number of alerts deleted."""
    with engine.begin() as conn:
        old = [
            int(r[0])
            for r in conn.execute(select(A.c.id).where(A.c.state == "resolved", A.c.resolved_at < before)).all()
        ]
        if old:
            conn.execute(delete(AlertTransition).where(AlertTransition.alert_id.in_(old)))
            conn.execute(delete(AlertDelivery).where(AlertDelivery.alert_id.in_(old)))
            conn.execute(delete(Alert).where(Alert.id.in_(old)))
        conn.execute(delete(AlertDelivery).where(AlertDelivery.alert_id.is_(None), AlertDelivery.created_at < before))
        conn.execute(delete(AlertSilence).where(AlertSilence.until < before))
    return len(old)


# ------------------------------------------------------------------ deliveries
def add_deliveries(engine: Engine, alert_id: int | None, deliveries: Sequence[NewDelivery], now: float) -> list[int]:
    with engine.begin() as conn:
        return _insert_deliveries(conn, alert_id, deliveries, now)


def due_deliveries(engine: Engine, now: float, limit: int = 50) -> list[DeliveryRow]:
    q = (
        select(D)
        .where(
            or_(
                and_(D.c.status == "pending", D.c.next_attempt_at <= now),
                and_(D.c.status == "sending", D.c.claimed_until < now),  # a crashed sender's lease ran out
            )
        )
        .order_by(D.c.next_attempt_at, D.c.id)
        .limit(limit)
    )
    with engine.connect() as conn:
        return [_delivery(r) for r in conn.execute(q)]


def claim_delivery(engine: Engine, delivery_id: int, now: float, lease_s: float) -> bool:
    """Compare-and-set pending (or expired sending) -> sending; only one process wins."""
    with engine.begin() as conn:
        res = conn.execute(
            update(AlertDelivery)
            .where(
                AlertDelivery.id == delivery_id,
                or_(
                    and_(AlertDelivery.status == "pending", AlertDelivery.next_attempt_at <= now),
                    and_(AlertDelivery.status == "sending", AlertDelivery.claimed_until < now),
                ),
            )
            .values(status="sending", claimed_until=now + lease_s, attempts=AlertDelivery.attempts + 1)
        )
        return res.rowcount == 1


def finish_delivery(
    engine: Engine,
    delivery_id: int,
    *,
    status: str,
    now: float,
    error: str | None = None,
    next_attempt_at: float | None = None,
) -> None:
    values: dict[str, Any] = {"status": status, "claimed_until": None, "last_error": (error or None)}
    if status == "sent":
        values["sent_at"] = now
    if next_attempt_at is not None:
        values["next_attempt_at"] = next_attempt_at
    with engine.begin() as conn:
        conn.execute(update(AlertDelivery).where(AlertDelivery.id == delivery_id).values(**values))


def get_delivery(engine: Engine, delivery_id: int) -> DeliveryRow | None:
    with engine.connect() as conn:
        row = conn.execute(select(D).where(D.c.id == delivery_id)).first()
    return _delivery(row) if row else None


def list_deliveries(
    engine: Engine, *, alert_id: int | None = None, channel: str | None = None, limit: int = 100
) -> list[DeliveryRow]:
    q = select(D)
    if alert_id is not None:
        q = q.where(D.c.alert_id == alert_id)
    if channel is not None:
        q = q.where(D.c.channel == channel)
    q = q.order_by(D.c.created_at.desc(), D.c.id.desc()).limit(limit)
    with engine.connect() as conn:
        return [_delivery(r) for r in conn.execute(q)]


def last_delivery_times(engine: Engine, channel: str) -> dict[int, float]:
    """alert id -> when the latest delivery to `channel` was queued."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(D.c.alert_id, func.max(D.c.created_at))
            .where(D.c.channel == channel, D.c.alert_id.is_not(None))
            .group_by(D.c.alert_id)
        ).all()
    return {int(a): float(t) for a, t in rows}


def unsent_alert_ids(engine: Engine, channel: str) -> set[int]:
    """Alerts with a delivery to `channel` still waiting (pending or being sent)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(D.c.alert_id)
            .where(D.c.channel == channel, D.c.alert_id.is_not(None), D.c.status.in_(("pending", "sending")))
            .distinct()
        ).all()
    return {int(r[0]) for r in rows}


# ------------------------------------------------------------------ silences
def add_silence(
    engine: Engine,
    *,
    now: float,
    until: float,
    rule: str | None = None,
    instance_id: int | None = None,
    host_id: int | None = None,
    reason: str = "",
) -> int:
    with engine.begin() as conn:
        res = conn.execute(
            insert(AlertSilence).values(
                created_at=now,
                until=until,
                rule=rule,
                instance_id=instance_id,
                host_id=host_id,
                reason=reason[:1000],
            )
        )
        pk = res.inserted_primary_key
        return int(pk[0]) if pk else 0


def active_silences(engine: Engine, now: float) -> list[SilenceRow]:
    with engine.connect() as conn:
        return [
            typed_row(SilenceRow, r._mapping)
            for r in conn.execute(select(S).where(S.c.until > now).order_by(S.c.until))
        ]


def expire_silence(engine: Engine, silence_id: int, now: float) -> bool:
    with engine.begin() as conn:
        res = conn.execute(
            update(AlertSilence).where(AlertSilence.id == silence_id, AlertSilence.until > now).values(until=now)
        )
        return res.rowcount == 1


# ------------------------------------------------------------------ per-instance overrides
def all_overrides(engine: Engine) -> dict[tuple[int, str], dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(select(O.c.instance_id, O.c.rule, O.c.params)).all()
    return {(int(i), str(r)): dict(p or {}) for i, r, p in rows}


def set_override(engine: Engine, instance_id: int, rule: str, params: dict[str, Any], now: float) -> None:
    with engine.begin() as conn:
        conn.execute(delete(AlertOverride).where(AlertOverride.instance_id == instance_id, AlertOverride.rule == rule))
        if params:
            conn.execute(
                insert(AlertOverride).values(instance_id=instance_id, rule=rule, params=params, updated_at=now)
            )
