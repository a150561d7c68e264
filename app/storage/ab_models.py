"""A/B tables: experiments and their runs. Mirrored by migrations/versions/0005_ab.py."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.models import Base


class AbExperiment(Base):
    __tablename__ = "ab_experiments"
    __table_args__ = (
        Index("ix_ab_experiments_instance", "instance_id", "created_at"),
        # At most one unfinished experiment per instance (enforced by the database).
        Index(
            "uq_ab_experiments_active",
            "instance_id",
            unique=True,
            sqlite_where=text("finished_at IS NULL"),
            postgresql_where=text("finished_at IS NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"))
    profile_a: Mapped[str] = mapped_column(String(64))
    profile_b: Mapped[str] = mapped_column(String(64))
    version_a_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    version_b_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The profile version the instance ran before: where cancel / failure / the end put it back.
    previous_version_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    workload: Mapped[dict[str, Any]] = mapped_column(JSON)
    # override_hybrid, run timeouts ... (what the experiment was asked to do besides the workload)
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    runs_per_arm: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer, default=0)
    # pending -> running -> (cancelling) -> restoring -> completed | failed | cancelled
    state: Mapped[str] = mapped_column(String(16))
    step: Mapped[str] = mapped_column(String(32), default="")
    current_run: Mapped[int] = mapped_column(Integer, default=0)
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    rollout_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the rollout being waited for
    step_started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The app process that moves this experiment on (its workload threads live there), with a lease:
    # another process takes over only when the lease ran out (the owner died).
    owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    verdict: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    requested_by: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class AbRun(Base):
    __tablename__ = "ab_runs"
    __table_args__ = (UniqueConstraint("experiment_id", "idx", name="uq_ab_runs_idx"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("ab_experiments.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    arm: Mapped[str] = mapped_column(String(1))  # A | B
    version_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # pending -> switching -> running -> done | failed | cancelled
    state: Mapped[str] = mapped_column(String(16), default="pending")
    rollout_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    argv: Mapped[list[str]] = mapped_column(JSON, default=list)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the workload runner's record (requests, counter deltas, server info) and its summary
    record: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    message: Mapped[str] = mapped_column(Text, default="")
