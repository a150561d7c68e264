"""Cache-sizing windows. Migration: migrations/versions/0010_sizing.py.

One row per pushed ReuseWindow (kvcore/protocol.py): one push interval of one instance's
KV-event stream as sampled LRU reuse distances. Windows add, so a range's curve is the sum of
its rows (app/sizing/curve.py).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.models import Base


class SizingWindow(Base):
    __tablename__ = "sizing_windows"
    __table_args__ = (Index("ix_sizing_windows_instance_end", "instance_id", "end_ts"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"))
    start_ts: Mapped[float] = mapped_column(Float)
    end_ts: Mapped[float] = mapped_column(Float)
    block_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rate: Mapped[float] = mapped_column(Float)
    # references, sampled, cold, reannounced, stored_tokens, messages, events, lost, garbage,
    # epochs, tier_stored, tier_removed, tracked_keys: the window's counts, as pushed
    counts: Mapped[dict[str, Any]] = mapped_column(JSON)
    bins: Mapped[list[Any]] = mapped_column(JSON)  # [[lower edge in blocks, weight], ...]
    received_at: Mapped[float] = mapped_column(Float)


class SizingCheck(Base):
    """A sizing prediction put to the test (migration 0014_sizing_checks): an A/B of the current
    size against the suggested one, or an applied size watched afterwards. Kept after it ends, so
    the page can say how good its last predictions were."""

    __tablename__ = "sizing_checks"
    __table_args__ = (Index("ix_sizing_checks_instance", "instance_id", "created_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # ab | apply
    state: Mapped[str] = mapped_column(String(16))  # running | done | failed
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    requested_by: Mapped[str] = mapped_column(String(200), default="")
    experiment_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    profile: Mapped[str] = mapped_column(String(64))  # the sized profile (arm B, or the one applied)
    # {"sizes": {"A": gib, "B": gib}, "range": [start, end], "at": {gib: {reload_share, ...}}, ...}
    prediction: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)  # per size: predicted vs measured, when known
