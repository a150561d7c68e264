"""What the store holds and the disk budget (KVSCOPE_STORAGE_BUDGET_MB).

The database's used size is read cheaply on both backends (SQLite: pages in use, not the free
list; PostgreSQL: pg_database_size). Over the budget, the oldest raw samples go first (whole
chunks, from the oldest time on, all series together) but only those already rolled up into
1-minute buckets: rollups stay, and no sample is lost before it is folded. The time the raw data
now starts from is kept (rollup_watermarks, tier "raw") so the reader knows ranges before it
have to come from rollups (app.derived.series_reader).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, func, insert, select, text, update
from sqlalchemy.exc import OperationalError

from app.storage import chunk_reads
from app.storage.chunk_seal import delete_raw_before
from app.storage.models import OpenChunk, SampleChunk, SampleRow, Series
from app.storage.rollup_buckets import watermark
from app.storage.rollup_models import Rollup1h, Rollup1m, RollupWatermark

RAW_CUT_TIER = "raw"  # rollup_watermarks row: raw samples before done_ms were dropped for the budget
MAX_STEPS = 50  # deletion rounds per run (each one transaction per IN list of series)
MIN_STEP_MS = 600_000  # each round drops at least ten more minutes of raw data
_RAW_TABLES = {
    "head": ("samples",),
    "chunks": ("sample_chunks", "uq_sample_chunks_series_end", "open_chunks"),
    "rollups": ("rollups_1m", "rollups_1h"),
}


@dataclass
class StoreUsage:
    """The overview's storage panel: sizes in bytes (None where the backend cannot tell)."""

    used_bytes: int  # the database's pages in use
    budget_bytes: int  # 0: no budget
    head_samples: int
    chunk_samples: int
    chunks: int
    rollup_rows: int
    raw_from_ms: int | None  # the oldest raw sample held
    head_bytes: int | None
    chunk_bytes: int | None
    rollup_bytes: int | None

    @property
    def samples(self) -> int:
        return self.head_samples + self.chunk_samples

    @property
    def raw_bytes_per_sample(self) -> float | None:
        if self.head_bytes is None or self.chunk_bytes is None or not self.samples:
            return None
        return (self.head_bytes + self.chunk_bytes) / self.samples

    @property
    def room_bytes(self) -> int | None:
        return max(0, self.budget_bytes - self.used_bytes) if self.budget_bytes else None


def used_bytes(conn: Connection) -> int:
    if conn.dialect.name == "sqlite":
        pages = int(conn.exec_driver_sql("PRAGMA page_count").scalar_one())
        free = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar_one())
        size = int(conn.exec_driver_sql("PRAGMA page_size").scalar_one())
        return (pages - free) * size
    if conn.dialect.name == "postgresql":
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
    return 0


def table_bytes(conn: Connection, names: tuple[str, ...]) -> int | None:
    """Bytes of the named tables and indexes: SQLite's dbstat (None when it is not compiled in),
    PostgreSQL's relation sizes."""
    if conn.dialect.name == "sqlite":
        try:
            marks = ", ".join("?" for _ in names)
            got = conn.exec_driver_sql(f"SELECT SUM(pgsize) FROM dbstat WHERE name IN ({marks})", names).scalar()
        except OperationalError:  # no dbstat in this SQLite build
            return None
        return int(got or 0)
    if conn.dialect.name == "postgresql":
        total = 0
        for name in names:
            if name.startswith("uq_"):
                continue  # counted with its table
            total += int(
                conn.execute(text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": name}).scalar_one()
            )
        return total
    return None


def store_usage(engine: Engine, budget_bytes: int) -> StoreUsage:
    with engine.connect() as conn:
        head = int(conn.execute(select(func.count()).select_from(SampleRow)).scalar_one())
        sealed_n, sealed_rows = conn.execute(
            select(func.coalesce(func.sum(SampleChunk.n), 0), func.count()).select_from(SampleChunk)
        ).one()
        open_n, open_rows = conn.execute(
            select(func.coalesce(func.sum(OpenChunk.n), 0), func.count()).select_from(OpenChunk)
        ).one()
        rollups = sum(int(conn.execute(select(func.count()).select_from(t)).scalar_one()) for t in (Rollup1m, Rollup1h))
        return StoreUsage(
            used_bytes=used_bytes(conn),
            budget_bytes=budget_bytes,
            head_samples=head,
            chunk_samples=int(sealed_n) + int(open_n),
            chunks=int(sealed_rows) + int(open_rows),
            rollup_rows=rollups,
            raw_from_ms=chunk_reads.first_ts(conn),
            head_bytes=table_bytes(conn, _RAW_TABLES["head"]),
            chunk_bytes=table_bytes(conn, _RAW_TABLES["chunks"]),
            rollup_bytes=table_bytes(conn, _RAW_TABLES["rollups"]),
        )


def raw_cut_ms(conn: Connection) -> int | None:
    """Raw samples before this were dropped to keep within the budget (None: never)."""
    return watermark(conn, RAW_CUT_TIER)


@dataclass
class BudgetReport:
    used_before: int = 0
    used_after: int = 0
    samples_deleted: int = 0
    cut_ms: int | None = None  # raw data now starts here
    over: bool = False  # still over the budget: what is left is not rolled up yet, or rollups


def apply_budget(engine: Engine, budget_bytes: int, now: float) -> BudgetReport:
    """Drop the oldest rolled-up raw samples until the database is within `budget_bytes`."""
    rep = BudgetReport()
    with engine.connect() as conn:
        rep.used_before = rep.used_after = used_bytes(conn)
        rolled = watermark(conn, "1m")
        ids = sorted(int(s) for (s,) in conn.execute(select(Series.id)))
    if budget_bytes <= 0 or rep.used_before <= budget_bytes:
        return rep
    for _ in range(MAX_STEPS):
        with engine.connect() as conn:
            oldest = chunk_reads.first_ts(conn)
            newest = int(now * 1000)
            raw = (table_bytes(conn, _RAW_TABLES["head"]) or 0) + (table_bytes(conn, _RAW_TABLES["chunks"]) or 0)
        if oldest is None or rolled is None or oldest >= rolled:
            rep.over = True
            break
        excess = rep.used_after - budget_bytes
        per_ms = raw / max(1, newest - oldest) if raw else 0.0
        # the time span whose raw data should free the excess (a tenth more; at least MIN_STEP_MS)
        span = int(excess / per_ms * 1.1) if per_ms > 0 else rolled - oldest
        # from the last cut on: chunks holding samples on both sides of it are still there
        base = max(oldest, rep.cut_ms or oldest)
        cut = min(rolled, base + max(MIN_STEP_MS, span))
        if cut <= base:
            rep.over = True
            break
        for i in range(0, len(ids), 500):
            with engine.begin() as conn:
                rep.samples_deleted += delete_raw_before(conn, ids[i : i + 500], cut)
        with engine.begin() as conn:
            _set_cut(conn, cut)
            rep.cut_ms = cut
            rep.used_after = used_bytes(conn)
        if rep.used_after <= budget_bytes:
            break
    else:
        rep.over = rep.used_after > budget_bytes
    return rep


def _set_cut(conn: Connection, cut: int) -> None:
    have = raw_cut_ms(conn)
    if have is None:
        conn.execute(insert(RollupWatermark).values(tier=RAW_CUT_TIER, done_ms=cut))
    elif cut > have:
        conn.execute(update(RollupWatermark).where(RollupWatermark.tier == RAW_CUT_TIER).values(done_ms=cut))
