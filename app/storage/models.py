"""SQLAlchemy 2 models. Alembic migrations in migrations/versions mirror these."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON}


class Host(Base):
    __tablename__ = "hosts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    agent_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    agent_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    first_seen: Mapped[float] = mapped_column(Float)
    last_push: Mapped[float | None] = mapped_column(Float, nullable=True)
    # pushes stored for this host (app/storage/series_generation.py: is a writer's record current?)
    write_seq: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Instance(Base):
    __tablename__ = "instances"
    __table_args__ = (UniqueConstraint("host_id", "url", name="uq_instances_host_url"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(String(1024))
    model: Mapped[str | None] = mapped_column(String(512), nullable=True)
    model_root: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    max_model_len: Mapped[int | None] = mapped_column(Integer, nullable=True)
    version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    first_seen: Mapped[float] = mapped_column(Float)
    last_scrape: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_ok: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    healthy: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # Labels of vllm:cache_config_info / kv_offload_config_info at the last scrape.
    cache_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    offload_config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Series(Base):
    """One time series: instance (or host-level when instance_id is NULL) + name + labels."""

    __tablename__ = "series"
    __table_args__ = (
        Index(
            "uq_series_identity",
            "host_id",
            func.coalesce("instance_id", 0),
            "name",
            "labels_key",
            unique=True,
        ),
        Index("ix_series_instance_name", "instance_id", "name"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"))
    instance_id: Mapped[int | None] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"), nullable=True)
    name: Mapped[str] = mapped_column(String(255))
    labels_key: Mapped[str] = mapped_column(Text)  # canonical JSON of the labels
    labels: Mapped[dict[str, Any]] = mapped_column(JSON)
    kind: Mapped[str] = mapped_column(String(16), default="gauge")  # counter | gauge | ...
    # bumped by a write of a sample older than the series' newest (app/storage/series_generation.py)
    write_gen: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class SampleRow(Base):
    """A raw sample of the head: what the ingest writes (timestamps in integer milliseconds;
    (series, ts) is the key). The sealing job moves samples older than a minute into chunks
    (SampleChunk, OpenChunk); reads see the three together (app/storage/chunk_reads.py)."""

    __tablename__ = "samples"
    __table_args__ = ({"sqlite_with_rowid": False},)
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    value: Mapped[float] = mapped_column(Float)


class SampleChunk(Base):
    """Sealed raw samples of one series: up to CHUNK_SAMPLES samples encoded together
    (app/storage/chunk_codec.py); written once, in time order (app/storage/chunk_seal.py). A rowid
    table on SQLite, so rows fill pages in insertion order and stay in the page (no overflow)."""

    __tablename__ = "sample_chunks"
    __table_args__ = (Index("uq_sample_chunks_series_end", "series_id", "end_ms", unique=True),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    series_id: Mapped[int] = mapped_column(Integer)
    start_ms: Mapped[int] = mapped_column(BigInteger)  # first sample's timestamp
    end_ms: Mapped[int] = mapped_column(BigInteger)  # last sample's timestamp
    n: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class OpenChunk(Base):
    """The chunk of a series still filling: sealed samples newer than its last SampleChunk,
    re-encoded with each sealing run until it holds CHUNK_SAMPLES, then moved to sample_chunks."""

    __tablename__ = "open_chunks"
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    start_ms: Mapped[int] = mapped_column(BigInteger)
    end_ms: Mapped[int] = mapped_column(BigInteger)
    n: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class AgentToken(Base):
    """Bearer tokens: agents' (role "agent", bound to one host) and scripts' (viewer/operator/admin)."""

    __tablename__ = "agent_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # first characters, to tell tokens apart
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_used: Mapped[float | None] = mapped_column(Float, nullable=True)
    role: Mapped[str] = mapped_column(String(16), default="agent", server_default="agent")
    host: Mapped[str | None] = mapped_column(String(255), nullable=True)  # agent tokens: the one host it may speak for


class User(Base):
    """People who log in. The password is stored as an argon2id hash; `session_epoch` grows on
    every password change or role change, which ends every session signed for an older epoch."""

    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    password_hash: Mapped[str] = mapped_column(String(255))
    session_epoch: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    last_login: Mapped[float | None] = mapped_column(Float, nullable=True)


class LoginLink(Base):
    """One-time login links (`kvscope up` / `demo` print one): stored hashed, used once, expire."""

    __tablename__ = "login_links"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    user_id: Mapped[int] = mapped_column(Integer, ForeignKey("users.id", ondelete="CASCADE"))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    used_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class IngestBatch(Base):
    """Seen (agent, seq) pairs: a replayed batch is acknowledged and not stored twice."""

    __tablename__ = "ingest_batches"
    agent_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    received_at: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer, default=0)


class Event(Base):
    """Restarts, config changes, counter resets, rollouts ...: marked on every chart."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_instance_ts", "instance_id", "ts"), Index("ix_events_ts", "ts"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    host_id: Mapped[int | None] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), nullable=True)
    instance_id: Mapped[int | None] = mapped_column(ForeignKey("instances.id", ondelete="CASCADE"), nullable=True)
    kind: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(16), default="app")  # agent | app | controller
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
