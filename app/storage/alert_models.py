"""Alert tables. Migration: migrations/versions/0004_alerts.py.

- alerts: one row per episode of one rule on one target (pending -> firing -> resolved).
  `active_key` holds the target key while the episode is open and NULL once resolved: its unique
  index means two app processes can never open the same alert twice. Every change is a
  compare-and-set on `version`.
- alert_transitions: every state change, as a row (the history page).
- alert_deliveries: one notification to one channel, retried with backoff; claimed by CAS.
- alert_silences, alert_overrides: set from the UI.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.models import Base


class Alert(Base):
    __tablename__ = "alerts"
    __table_args__ = (
        Index("uq_alerts_active_key", "active_key", unique=True),
        Index("ix_alerts_key_opened", "key", "opened_at"),
        Index("ix_alerts_state", "state"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(512))  # rule + target, e.g. "hit_rate_drop:overall|instance:3"
    active_key: Mapped[str | None] = mapped_column(String(512), nullable=True)
    rule: Mapped[str] = mapped_column(String(64))
    host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), nullable=True)
    instance_id: Mapped[int | None] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"), nullable=True)
    state: Mapped[str] = mapped_column(String(16))  # pending | firing | resolved
    severity: Mapped[str] = mapped_column(String(16), default="warning")
    opened_at: Mapped[float] = mapped_column(Float)  # became pending
    since: Mapped[float] = mapped_column(Float)  # entered the current state
    fired_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    resolved_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_eval: Mapped[float] = mapped_column(Float)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    baseline: Mapped[float | None] = mapped_column(Float, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    hints: Mapped[list[Any]] = mapped_column(JSON, default=list)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    acked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ack_note: Mapped[str | None] = mapped_column(Text, nullable=True)
    version: Mapped[int] = mapped_column(Integer, default=1)


class AlertTransition(Base):
    __tablename__ = "alert_transitions"
    __table_args__ = (Index("ix_alert_transitions_alert", "alert_id"), Index("ix_alert_transitions_ts", "ts"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Float)
    from_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_state: Mapped[str] = mapped_column(String(16))
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")


class AlertDelivery(Base):
    __tablename__ = "alert_deliveries"
    __table_args__ = (
        Index("ix_alert_deliveries_due", "status", "next_attempt_at"),
        Index("ix_alert_deliveries_alert", "alert_id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    alert_id: Mapped[int | None] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), nullable=True)
    channel: Mapped[str] = mapped_column(String(128))
    event: Mapped[str] = mapped_column(String(16))  # firing | resolved | refresh | test
    status: Mapped[str] = mapped_column(String(16))  # pending | sending | sent | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    claimed_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # the alert as it was at enqueue


class AlertSilence(Base):
    __tablename__ = "alert_silences"
    __table_args__ = (Index("ix_alert_silences_until", "until"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int | None] = mapped_column(
        ForeignKey("instances.id", ondelete="CASCADE"), nullable=True
    )  # NULL = every target
    host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), nullable=True)
    rule: Mapped[str | None] = mapped_column(String(64), nullable=True)  # NULL = every rule
    created_at: Mapped[float] = mapped_column(Float)
    until: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")


class AlertOverride(Base):
    __tablename__ = "alert_overrides"
    __table_args__ = (UniqueConstraint("instance_id", "rule", name="uq_alert_overrides_instance_rule"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"))
    rule: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[float] = mapped_column(Float)
