"""What the store holds and the disk budget (KVSCOPE_STORAGE_BUDGET_MB).

The database's used size is read cheaply on both backends (SQLite: pages in use, not the free
list; PostgreSQL: pg_database_size). Over the budget, the oldest raw samples go first (whole
chunks, from the oldest time on, all series together) but only those already rolled up into
1-minute buckets: rollups stay, and no sample is lost before it is folded. The time the raw data
now starts from is kept (rollup_watermarks, tier "raw"), recorded before the samples go, so the
reader knows ranges before it have to come from rollups (app.derived.series_reader) and serves
nothing before it from memory (app/storage/series_generation.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, func, insert, select, text, update

from app.storage import chunk_reads
from app.storage.chunk_seal import delete_raw_before
from app.storage.models import OpenChunk, SampleChunk, SampleRow, Series
from app.storage.rollup_buckets import watermark
from app.storage.rollup_models import RollupWatermark

RAW_CUT_TIER = "raw"  # rollup_watermarks row: raw samples before done_ms were dropped for the budget
MAX_STEPS = 50  # deletion rounds per run (each one transaction per IN list of series)
HEAD_ROW_BYTES = 24  # a head row with its share of the page (measured with dbstat: 19-25)
MIN_STEP_MS = 600_000  # each round drops at least ten more minutes of raw data
_RAW_TABLES = {"head": ("samples",), "chunks": ("sample_chunks", "uq_sample_chunks_series_end", "open_chunks")}


@dataclass
class StoreUsage:
    """What the store holds, for the overview's storage panel: cheap to read (no scan of the
    rollup tables; the chunks' payload is one pass over the chunk rows)."""

    used_bytes: int  # the database's pages in use (SQLite: not the free list)
    budget_bytes: int  # 0: no budget
    head_samples: int  # raw samples still rows (the last minute, and a conversion not done yet)
    chunk_samples: int
    chunks: int
    chunk_payload_bytes: int  # the encoded chunks themselves (rows and pages cost a little more)
    raw_from_ms: int | None  # the oldest raw sample held
    raw_cut_ms: int | None  # the budget dropped raw samples before this

    @property
    def samples(self) -> int:
        return self.head_samples + self.chunk_samples

    @property
    def chunk_bytes_per_sample(self) -> float | None:
        return self.chunk_payload_bytes / self.chunk_samples if self.chunk_samples else None

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


def store_usage(engine: Engine, budget_bytes: int) -> StoreUsage:
    with engine.connect() as conn:
        head = int(conn.execute(select(func.count()).select_from(SampleRow)).scalar_one())
        totals = [
            conn.execute(
                select(func.coalesce(func.sum(t.n), 0), func.count(), func.coalesce(func.sum(func.length(t.data)), 0))
            ).one()
            for t in (SampleChunk, OpenChunk)
        ]
        return StoreUsage(
            used_bytes=used_bytes(conn),
            budget_bytes=budget_bytes,
            head_samples=head,
            chunk_samples=sum(int(n) for n, _, _ in totals),
            chunks=sum(int(c) for _, c, _ in totals),
            chunk_payload_bytes=sum(int(b) for _, _, b in totals),
            raw_from_ms=chunk_reads.first_ts(conn),
            raw_cut_ms=raw_cut_ms(conn),
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
        usage = store_usage(engine, budget_bytes)
        raw = usage.chunk_payload_bytes + usage.head_samples * HEAD_ROW_BYTES
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
        with engine.begin() as conn:  # recorded first: readers stop serving what is about to go
            _set_cut(conn, cut)
        rep.cut_ms = cut
        for i in range(0, len(ids), 500):
            with engine.begin() as conn:
                rep.samples_deleted += delete_raw_before(conn, ids[i : i + 500], cut)
        with engine.connect() as conn:
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
