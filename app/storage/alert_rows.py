"""The rows alerts_store returns: one typed definition per kind of row, so mypy checks the keys a
consumer reads. They stay plain dicts at run time (pages, JSON and delivery snapshots use them as
they are). JSON columns (labels, hints, payload) keep their loose types: their shape is the
rule's and the channel's, not the table's."""

from __future__ import annotations

from typing import Any, TypedDict


class AlertRow(TypedDict):
    """An alert episode with its target's URL, model and host name (None for a host-level alert
    or a target that is gone): open_alerts, list_alerts, get_alert."""

    id: int
    key: str
    active_key: str | None
    rule: str
    host_id: int | None
    instance_id: int | None
    state: str
    severity: str
    opened_at: float
    since: float
    fired_at: float | None
    resolved_at: float | None
    last_eval: float
    value: float | None
    baseline: float | None
    message: str
    hints: list[Any]
    labels: dict[str, Any]
    acked_at: float | None
    ack_note: str | None
    version: int
    instance_url: str | None
    model: str | None
    simulated: bool | None
    host: str | None


class AlertTransitionRow(TypedDict):
    """A stored state change with its alert's rule, key and target (list_transitions). The one to
    write is alerts_store.TransitionRow."""

    id: int
    alert_id: int
    ts: float
    from_state: str | None
    to_state: str
    value: float | None
    message: str
    rule: str
    key: str
    instance_id: int | None
    instance_url: str | None
    host: str | None


class DeliveryRow(TypedDict):
    """One notification to one channel (due_deliveries, get_delivery, list_deliveries)."""

    id: int
    alert_id: int | None
    channel: str
    event: str
    status: str
    attempts: int
    created_at: float
    next_attempt_at: float
    claimed_until: float | None
    sent_at: float | None
    last_error: str | None
    payload: dict[str, Any]


class SilenceRow(TypedDict):
    """A silence: NULL rule, instance or host matches every one (active_silences)."""

    id: int
    instance_id: int | None
    host_id: int | None
    rule: str | None
    created_at: float
    until: float
    reason: str
