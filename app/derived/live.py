"""Live-range memo: grid values of raw series that a refresh does not have to compute again.

A live chart (a named range ending now) is redrawn every 15 s over a window that moved by 15 s:
all but the newest few instants were computed on the previous refresh. A rate or gauge at an
instant t depends only on the samples in (t - window, t], so once t is older than `freeze_lag_s`
(the pushes of that time have arrived) its value is final. This memo keeps final values per
series, per function (rate, gauge) and per grid (step, window); a refresh then reads only the
samples after the last final instant and computes only the new instants. The result is identical
to a full computation (tests compare both on random data with resets, gaps and late samples).

A value is final only where the series' samples are complete: at instants no later than its
newest sample (an append lands after it) and older than the freeze lag. A late sample (an
agent's spool replayed after an outage, through this app process or another) moves the series'
write generation (app/storage/series_generation.py): memos are kept with the generation they
were computed at, and one of another generation is dropped when looked up. A computation that
raced with the replay stores its values under the generation it read before the points, so
they are dropped at the next refresh. No time-to-live and no push hook: exact across processes.
"""

from __future__ import annotations

import hashlib
import math
import threading
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.derived.series_types import Point, TieredSeries

Values = list[float | None]
# (points, first instant, last instant) -> values at the step-aligned instants in between
Compute = Callable[[Sequence[Point], float, float], Values]
_NAN = math.nan


@dataclass
class LiveHandle:
    """What a live series needs beyond its tail of points: the memo and the full points on demand."""

    cache: LiveValues
    gen: int  # the series' write generation, read before its points
    tail_lo: float  # the series' points start here (seconds)
    now: float
    tail: list[Point] = field(repr=False)
    load_full: Callable[[], list[Point]]
    _full: list[Point] | None = field(default=None, repr=False)

    def full_points(self) -> list[Point]:
        if self._full is None:
            self._full = self.load_full()
        return self._full

    def newest(self) -> float:
        """The newest sample read (-inf: none): instants after it may still get samples."""
        pts = self._full if self._full is not None else self.tail
        return pts[-1][0] if pts else -math.inf


@dataclass
class DerivedHandle:
    """The memo handle of a value derived pointwise from several live series: valid while none
    of their write generations moved (their sum: each only grows), final where all are."""

    cache: LiveValues
    gen: int
    now: float
    parts: Sequence[LiveHandle]

    def newest(self) -> float:
        return min(h.newest() for h in self.parts)


@dataclass(frozen=True)
class LiveRawSeries(TieredSeries):
    """A raw series of a live range whose `points` hold only the samples from `handle.tail_lo`:
    evaluate it through app.derived.grid_math (which knows), never by reading points directly."""

    handle: LiveHandle | None = None


@dataclass
class _Memo:
    first_t: float
    values: array  # type: ignore[type-arg]  # 'd'; NaN stands for "no value"
    gen: int  # the write generation the values were computed at


class LiveValues:
    """Per-process memo of final raw-tier grid values. Thread-safe; bounded (LRU by series)."""

    def __init__(self, freeze_lag_s: float = 10.0, max_values: int = 8_000_000) -> None:
        self.freeze_lag_s = freeze_lag_s
        self.max_values = max_values
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, float, float], dict[str, _Memo]] = OrderedDict()
        self._size = 0
        self.incremental = 0  # evaluations that reused final values
        self.full = 0  # evaluations computed from every point of the range

    def final_until(self, series_id: int, step: float, window: float, gen: int) -> float | None:
        """The earliest last-final instant over the functions memoised for this series and grid
        at write generation `gen` (memos of another generation are dropped)."""
        with self._lock:
            key = (series_id, step, window)
            memos = self._valid(key, gen)
            if not memos:
                return None
            return min(m.first_t + (len(m.values) - 1) * step for m in memos.values())

    def lookup(self, series_id: int, step: float, window: float, fn: str, gen: int) -> _Memo | None:
        with self._lock:
            key = (series_id, step, window)
            memos = self._valid(key, gen)
            memo = memos.get(fn) if memos else None
            if memo is None:
                return None
            self._entries.move_to_end(key)
            return memo

    def _valid(self, key: tuple[int, float, float], gen: int) -> dict[str, _Memo] | None:
        """The memos of `key` computed at `gen`; those of another generation are forgotten."""
        memos = self._entries.get(key)
        if not memos:
            return None
        for fn, m in list(memos.items()):
            if m.gen != gen:
                self._size -= len(m.values)
                del memos[fn]
        if not memos:
            del self._entries[key]
            return None
        return memos

    def store(
        self, series_id: int, step: float, window: float, fn: str, first_t: float, values: Values, gen: int
    ) -> None:
        """Keep `values` (instants first_t, first_t + step, ...: all final), computed from points
        read at write generation `gen`."""
        arr = array("d", [_NAN if v is None else v for v in values])
        with self._lock:
            key = (series_id, step, window)
            memos = self._entries.setdefault(key, {})
            old = memos.get(fn)
            self._size += len(arr) - (len(old.values) if old else 0)
            memos[fn] = _Memo(first_t, arr, gen)
            self._entries.move_to_end(key)
            while self._size > self.max_values and len(self._entries) > 1:
                _, dropped = self._entries.popitem(last=False)
                self._size -= sum(len(m.values) for m in dropped.values())

    @property
    def size(self) -> int:
        return self._size


def grid_values(
    s: LiveRawSeries, times: Sequence[float], step: float, window: float, lookback: float, fn: str, compute: Compute
) -> Values:
    """`compute` on the step-aligned `times`, reusing the memo's final values and storing the new ones."""
    if not times:
        return []
    h = s.handle
    assert h is not None
    memo = h.cache.lookup(s.series_id, step, window, fn, h.gen)
    head = _head(memo, times, step)
    rest = times[len(head) :]
    if head:
        h.cache.incremental += 1
    else:
        h.cache.full += 1
    if rest:
        pts = s.points if rest[0] - lookback >= h.tail_lo else h.full_points()
        out = head + compute(pts, rest[0], rest[-1])
    else:
        out = head
    n_final = _n_final(h, times)
    if n_final > len(head) or (memo is not None and memo.first_t < times[0] and n_final):
        h.cache.store(s.series_id, step, window, fn, times[0], out[:n_final], h.gen)
    return out


def derived_memo(series: Sequence[TieredSeries], tag: str) -> tuple[int, DerivedHandle] | None:
    """For a value derived pointwise from several live series (a histogram's quantiles from its
    bucket rates): a memo key of its own (a negative id, apart from real series) and a handle
    to store with. None unless every series is live."""
    handles = [s.handle for s in series if isinstance(s, LiveRawSeries) and s.handle is not None]
    if not series or len(handles) != len(series):
        return None
    ids = ",".join(str(s.series_id) for s in sorted(series, key=lambda x: x.series_id))
    digest = hashlib.blake2b(f"{tag}:{ids}".encode(), digest_size=7).digest()
    derived = DerivedHandle(handles[0].cache, sum(h.gen for h in handles), handles[0].now, handles)
    return -1 - int.from_bytes(digest, "big"), derived


def memo_head(
    handle: DerivedHandle, key: int, times: Sequence[float], step: float, window: float, fns: Sequence[str]
) -> list[Values]:
    """The final values memoised for each of `fns` from times[0] on, cut to a common length."""
    heads: list[Values] = []
    for fn in fns:
        memo = handle.cache.lookup(key, step, window, fn, handle.gen)
        if memo is None or memo.first_t > times[0]:
            return [[] for _ in fns]
        heads.append(_head(memo, times, step))
    n = min(len(h) for h in heads)
    return [h[:n] for h in heads]


def memo_store(
    handle: DerivedHandle,
    key: int,
    times: Sequence[float],
    step: float,
    window: float,
    values: dict[str, Values],
) -> None:
    n_final = _n_final(handle, times)
    if n_final:
        for fn, vals in values.items():
            handle.cache.store(key, step, window, fn, times[0], vals[:n_final], handle.gen)


def _head(memo: _Memo | None, times: Sequence[float], step: float) -> Values:
    """The memo's final values at times[0], times[1], ... (as many as it holds; NaN -> None)."""
    if memo is None or memo.first_t > times[0]:
        return []
    k0 = round((times[0] - memo.first_t) / step)
    return [None if v != v else v for v in memo.values[k0 : k0 + len(times)]]


def _n_final(handle: LiveHandle | DerivedHandle, times: Sequence[float]) -> int:
    """How many of `times` are final: older than the freeze lag at the handle's `now`, and no
    later than the newest sample read (a sample appended after it would change them)."""
    return bisect_right(times, min(handle.now - handle.cache.freeze_lag_s, handle.newest()))
