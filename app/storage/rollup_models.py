"""Rollup tables: 1-minute and 1-hour aggregates of every series, and the job's bookkeeping.

A bucket row holds min / max / sum / count of the raw values in [bucket, bucket + res), the last
value and, for counters, the reset-corrected increase from the last sample BEFORE the bucket to
the last sample in it. Increases of consecutive buckets therefore add up exactly to the
increase over the whole span, and a rate over any run of buckets is sum(inc) / span.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.models import Base


class _BucketColumns:
    """The columns of a bucket row, written once for both tiers (a SQLAlchemy mixin)."""

    __table_args__ = ({"sqlite_with_rowid": False},)
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    vmin: Mapped[float] = mapped_column(Float)
    vmax: Mapped[float] = mapped_column(Float)
    vsum: Mapped[float] = mapped_column(Float)
    vlast: Mapped[float] = mapped_column(Float)
    inc: Mapped[float | None] = mapped_column(Float, nullable=True)  # counters only


class Rollup1m(_BucketColumns, Base):
    __tablename__ = "rollups_1m"


class Rollup1h(_BucketColumns, Base):
    __tablename__ = "rollups_1h"


class RollupCarry(Base):
    """The last raw sample of each series already folded into 1-minute buckets."""

    __tablename__ = "rollup_carry"
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts_ms: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float] = mapped_column(Float)


class RollupWatermark(Base):
    """Per tier: everything before done_ms is rolled up (bucket-aligned)."""

    __tablename__ = "rollup_watermarks"
    tier: Mapped[str] = mapped_column(String(8), primary_key=True)
    done_ms: Mapped[int] = mapped_column(BigInteger)


class RollupLate(Base):
    """Series that received samples older than the 1-minute watermark (a spool replaying late):
    from_ms is the oldest such sample; the job re-rolls that series' buckets from there."""

    __tablename__ = "rollup_late"
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    from_ms: Mapped[int] = mapped_column(BigInteger)
