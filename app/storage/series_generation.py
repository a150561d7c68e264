"""What lets a reader keep a series' points, and values computed from them, without a
time-to-live: a per-series write generation and a watermark of what the raw store still keeps.

- `series.write_gen` moves when a write puts a sample older than the series' newest stored one
  (a spool replayed late, a second agent, a replay through another app process): a reader may
  have read the series past that instant, so what it keeps of the series is stale. Plain
  appends at the end leave it alone: a reader that remembers the newest point it read fetches
  only what comes after it (app/derived/series_cache.py). A sample at the newest instant is a
  duplicate the store ignores (the first value stays). One at an older instant already held
  counts as late all the same (telling would cost a read per push): readers re-read the series
  once, which costs time, never a wrong value.
- The raw watermark (`kept_from_ms`): raw retention and the disk budget delete only samples
  before a cut, and record the cut before they delete (`record_kept_from`, the budget's cut in
  app/storage/store_budget.py). A reader never serves points before the watermark from memory:
  what lies before it is read from storage every time (a chunk holding samples on both sides of
  a cut stays whole until its last sample is past it).

The ingest marks late writes inside its transaction (`mark_late_writes`), before it inserts the
rows. Whether a sample is older than the newest stored one it knows from its own record of each
series' newest sample, which is exact while no other writer touched the host since this
writer's previous push of it: every push increments `hosts.write_seq` under the host row's lock
(pushes of one host are serialised there, on both backends), and a writer that finds the count
moved by more than its own push reads the newest samples of the push's series from storage.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, insert, select, update

from app.storage import chunk_reads
from app.storage.models import Series
from app.storage.rollup_models import RollupWatermark
from app.storage.store_budget import RAW_CUT_TIER

KEPT_TIER = "raw_kept"  # rollup_watermarks row: raw retention deleted only samples before done_ms
_NONE = -(2**62)  # "no sample stored": older than any timestamp
IN_CHUNK = 500


@dataclass
class NewestSamples:
    """A writer's record of the newest stored sample (ts_ms) of each series, per host, with the
    host's write_seq after this writer's last push of it (one per IngestWriter)."""

    by_host: dict[int, dict[int, int]] = field(default_factory=dict)
    seq: dict[int, int] = field(default_factory=dict)

    def clear(self) -> None:
        """Forget everything (a transaction that failed may have recorded what it rolled back)."""
        self.by_host.clear()
        self.seq.clear()


def mark_late_writes(
    conn: Connection,
    host_id: int,
    write_seq: int,
    rows: Sequence[tuple[int, int, float]],
    known: NewestSamples,
    created: Collection[int] = (),
) -> int:
    """Called by the ingest inside its transaction, after incrementing the host's write_seq to
    `write_seq` and before inserting `rows` (series_id, ts_ms, value; `created`: series this
    push created, with nothing stored): bumps the write
    generation of each series that gets a sample older than its newest stored one. Returns how
    many series were bumped. Costs no statement when nothing is late and no other writer wrote
    the host in between; else one read of the newest samples of the series this writer does
    not know (the first push of a host in this process, or after another process's push): index
    seeks for a point after the push's oldest sample, and the newest sample of those that have one."""
    newest = known.by_host.get(host_id)
    if newest is None or known.seq.get(host_id) != write_seq - 1:
        newest = known.by_host[host_id] = {}
    known.seq[host_id] = write_seq
    if not rows:
        return 0
    newest.update(dict.fromkeys(created, _NONE))
    unknown = sorted({sid for sid, _, _ in rows if sid not in newest})
    if unknown:
        # only series holding a point after the push's oldest sample can make it late: their
        # newest is read (decoding a chunk's end); the others' newest is at or before that sample
        oldest = min(ts for _, ts, _ in rows)
        after = sorted(chunk_reads.series_with_points_after(conn, unknown, oldest))
        newest.update(dict.fromkeys(unknown, _NONE))
        for i in range(0, len(after), IN_CHUNK):
            stored = chunk_reads.last_points(conn, after[i : i + IN_CHUNK])
            newest.update({sid: ts for sid, (ts, _) in stored.items()})
    late: set[int] = set()
    pushed: dict[int, int] = {}
    for sid, ts, _ in rows:
        if ts < newest[sid]:
            late.add(sid)
        if ts > pushed.get(sid, _NONE):
            pushed[sid] = ts
    for sid, ts in pushed.items():
        if ts > newest[sid]:
            newest[sid] = ts
    if late:
        ordered = sorted(late)
        for i in range(0, len(ordered), IN_CHUNK):
            conn.execute(
                update(Series).where(Series.id.in_(ordered[i : i + IN_CHUNK])).values(write_gen=Series.write_gen + 1)
            )
    return len(late)


def record_kept_from(conn: Connection, cut_ms: int) -> None:
    """Before raw retention deletes samples before `cut_ms`: readers stop serving points before it
    from memory. The watermark only moves forward."""
    have = conn.execute(select(RollupWatermark.done_ms).where(RollupWatermark.tier == KEPT_TIER)).first()
    if have is None:
        conn.execute(insert(RollupWatermark).values(tier=KEPT_TIER, done_ms=cut_ms))
    elif cut_ms > int(have[0]):
        conn.execute(update(RollupWatermark).where(RollupWatermark.tier == KEPT_TIER).values(done_ms=cut_ms))


# built once: every raw read reads it (the statement's construction cost more than its run)
_WATERMARKS = select(RollupWatermark.tier, RollupWatermark.done_ms).where(
    RollupWatermark.tier.in_([RAW_CUT_TIER, KEPT_TIER])
)


@dataclass(frozen=True)
class RawWatermarks:
    budget_cut_ms: int | None  # the disk budget dropped raw samples before this (None: never)
    kept_from_ms: int | None  # raw samples before this may have been deleted (None: none ever)


def raw_watermarks(conn: Connection) -> RawWatermarks:
    """Both raw cuts in one read: the budget's (which the tier choice reads) and the later of it
    and the retention's (before which a reader serves nothing from memory)."""
    got = {str(tier): int(ms) for tier, ms in conn.execute(_WATERMARKS)}
    cuts = list(got.values())
    return RawWatermarks(got.get(RAW_CUT_TIER), max(cuts) if cuts else None)
