"""Rollup buckets: the 1-minute and 1-hour bucket, folding raw points into minutes and minutes into
hours, a bucket's row, and the tiers' watermarks. Shared by the rollup job (rollups.py) and the
late-sample re-roll (rollup_late.py), which import it and not each other."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, select

from app.storage.rollup_models import RollupWatermark
from kvcore.series import reset_step

MINUTE_MS = 60_000
HOUR_MS = 3_600_000


class Bucket(NamedTuple):
    """One aggregate. ts = bucket start (s); inc is None for gauges. A tuple: cheap to build."""

    ts: float
    n: int
    vmin: float
    vmax: float
    vsum: float
    vlast: float
    inc: float | None

    @property
    def mean(self) -> float:
        return self.vsum / self.n if self.n else math.nan


def fold_minutes(
    samples: Sequence[tuple[int, float]], carry: tuple[int, float] | None, counter: bool, res_ms: int = MINUTE_MS
) -> tuple[list[tuple[int, Bucket]], tuple[int, float] | None]:
    """Fold ascending raw (ts_ms, value) samples of one series into buckets of res_ms.

    `carry` is the last sample before these (from the previous run); a counter's increase in a
    bucket starts from it, with a decrease counted as a reset (the increase is the new value).
    Returns [(bucket_ms, Bucket)] and the new carry."""
    out: list[tuple[int, Bucket]] = []
    cur_b: int | None = None
    n = 0
    vmin = vmax = vsum = vlast = 0.0
    inc = 0.0
    prev = carry[1] if carry is not None else None
    last_ts = carry[0] if carry is not None else None
    for ts, v in samples:
        if last_ts is not None and ts <= last_ts:
            continue  # already folded
        b = ts - ts % res_ms
        if b != cur_b:
            if cur_b is not None:
                out.append((cur_b, Bucket(cur_b / 1000, n, vmin, vmax, vsum, vlast, inc if counter else None)))
            cur_b, n, vmin, vmax, vsum, inc = b, 0, v, v, 0.0, 0.0
        n += 1
        if v < vmin:  # = min(vmin, v) and max(vmax, v), without two calls per sample
            vmin = v
        if v > vmax:
            vmax = v
        vsum += v
        vlast = v
        if prev is not None:
            inc += reset_step(prev, v)
        prev = v
        last_ts = ts
    if cur_b is not None:
        out.append((cur_b, Bucket(cur_b / 1000, n, vmin, vmax, vsum, vlast, inc if counter else None)))
    new_carry = (last_ts, prev) if last_ts is not None and prev is not None else carry
    return out, new_carry


def fold_hours(minutes: Sequence[tuple[int, Bucket]]) -> list[tuple[int, Bucket]]:
    """Fold ascending 1-minute buckets of one series into hours (increases add up)."""
    out: list[tuple[int, Bucket]] = []
    acc: list[Bucket] = []
    cur: int | None = None

    def flush() -> None:
        if cur is None or not acc:
            return
        incs = [b.inc for b in acc]
        out.append(
            (
                cur,
                Bucket(
                    cur / 1000,
                    sum(b.n for b in acc),
                    min(b.vmin for b in acc),
                    max(b.vmax for b in acc),
                    sum(b.vsum for b in acc),
                    acc[-1].vlast,
                    None if any(i is None for i in incs) else sum(i for i in incs if i is not None),
                ),
            )
        )

    for ms, b in minutes:
        h = ms - ms % HOUR_MS
        if h != cur:
            flush()
            cur, acc = h, []
        acc.append(b)
    flush()
    return out


def watermark(conn: Connection, tier: str) -> int | None:
    row = conn.execute(select(RollupWatermark.done_ms).where(RollupWatermark.tier == tier)).first()
    return int(row[0]) if row else None


def bucket_row(sid: int, ms: int, b: Bucket) -> dict[str, Any]:
    return {
        "series_id": sid,
        "bucket_ms": ms,
        "n": b.n,
        "vmin": b.vmin,
        "vmax": b.vmax,
        "vsum": b.vsum,
        "vlast": b.vlast,
        "inc": b.inc,
    }
