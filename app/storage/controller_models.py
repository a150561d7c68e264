"""Controller tables: profiles with history, each instance's current / last-known-good profile,
rollouts with their state. Mirrored by migrations/versions/0003_controller.py."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.models import Base


class ControllerProfile(Base):
    __tablename__ = "controller_profiles"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    current_version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class ControllerProfileVersion(Base):
    """Every saved edit of a profile; rollouts point at the exact version they applied."""

    __tablename__ = "controller_profile_versions"
    __table_args__ = (UniqueConstraint("profile_id", "version", name="uq_profile_version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    profile_id: Mapped[int] = mapped_column(ForeignKey("controller_profiles.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)
    author: Mapped[str] = mapped_column(String(255), default="")
    note: Mapped[str] = mapped_column(Text, default="")


class ControllerInstanceProfile(Base):
    """The profile version an instance runs now, and the last one verified healthy."""

    __tablename__ = "controller_instance_profiles"
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"), primary_key=True)
    current_version_id: Mapped[int | None] = mapped_column(ForeignKey("controller_profile_versions.id"), nullable=True)
    lkg_version_id: Mapped[int | None] = mapped_column(ForeignKey("controller_profile_versions.id"), nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)


class ControllerRollout(Base):
    __tablename__ = "controller_rollouts"
    __table_args__ = (
        Index("ix_controller_rollouts_instance", "instance_id", "created_at"),
        Index("ix_controller_rollouts_state", "state"),
        # At most one unfinished rollout per instance (the database enforces it, not a race).
        Index(
            "uq_controller_rollouts_active",
            "instance_id",
            unique=True,
            sqlite_where=text("finished_at IS NULL"),
            postgresql_where=text("finished_at IS NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_id: Mapped[int] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"))
    version_id: Mapped[int] = mapped_column(ForeignKey("controller_profile_versions.id"))
    lkg_version_id: Mapped[int | None] = mapped_column(ForeignKey("controller_profile_versions.id"), nullable=True)
    state: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    requested_by: Mapped[str] = mapped_column(String(255), default="")
    override_hybrid: Mapped[bool] = mapped_column(Boolean, default=False)
    # The command as handed to the agent (argv, lkg argv, deadlines, probe parameters).
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    # What the agent reported: preflight checks, probe TTFTs and counter deltas, timings.
    result: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    claimed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    claimed_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
