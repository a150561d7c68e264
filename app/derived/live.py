"""Live-range memo: grid values of raw series that a refresh does not have to compute again.

A live chart (a named range ending now) is redrawn every 15 s over a window that moved by 15 s:
all but the newest few instants were computed on the previous refresh. A rate or gauge at an
instant t depends only on the samples in (t - window, t], so once t is older than `freeze_lag_s`
(the pushes of that time have arrived) its value is final. This memo keeps final values per
series, per function (rate, gauge) and per grid (step, window); a refresh then reads only the
samples after the last final instant and computes only the new instants. The result is identical
to a full computation (tests compare both on random data with resets, gaps and late samples).

Late samples (an agent's spool replayed after an outage) change instants already final: the
ingest hook drops a host's memos when a push carries samples older than the freeze lag, and a
generation number stops a computation that raced with the replay from storing what it read
before. Other app processes do not see that hook, so memos also expire after `ttl_s` (jittered,
so they do not all expire together): a replay through another process shows within that time.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
import time
from array import array
from bisect import bisect_right
from collections import OrderedDict, defaultdict
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
    host_id: int
    generation: int
    tail_lo: float  # the series' points start here (seconds)
    now: float
    load_full: Callable[[], list[Point]]
    _full: list[Point] | None = field(default=None, repr=False)

    def full_points(self) -> list[Point]:
        if self._full is None:
            self._full = self.load_full()
        return self._full


@dataclass(frozen=True)
class LiveRawSeries(TieredSeries):
    """A raw series of a live range whose `points` hold only the samples from `handle.tail_lo`:
    evaluate it through app.derived.grid_math (which knows), never by reading points directly."""

    handle: LiveHandle | None = None


@dataclass
class _Memo:
    first_t: float
    values: array  # type: ignore[type-arg]  # 'd'; NaN stands for "no value"
    host_id: int
    expires: float


class LiveValues:
    """Per-process memo of final raw-tier grid values. Thread-safe; bounded (LRU by series)."""

    def __init__(
        self,
        freeze_lag_s: float = 10.0,
        ttl_s: float = 900.0,
        max_values: int = 8_000_000,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.freeze_lag_s = freeze_lag_s
        self.ttl_s = ttl_s
        self.max_values = max_values
        self.clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, float, float], dict[str, _Memo]] = OrderedDict()
        self._size = 0
        self._gen: dict[int, int] = defaultdict(int)
        self._by_host: dict[int, set[tuple[int, float, float]]] = defaultdict(set)
        self.incremental = 0  # evaluations that reused final values
        self.full = 0  # evaluations computed from every point of the range

    def generation(self, host_id: int) -> int:
        with self._lock:
            return self._gen[host_id]

    def final_until(self, series_id: int, step: float, window: float) -> float | None:
        """The earliest last-final instant over the functions memoised for this series and grid."""
        with self._lock:
            memos = self._entries.get((series_id, step, window))
            if not memos:
                return None
            now = self.clock()
            lasts = [m.first_t + (len(m.values) - 1) * step for m in memos.values() if m.expires > now]
            return min(lasts) if lasts else None

    def lookup(self, series_id: int, step: float, window: float, fn: str) -> _Memo | None:
        with self._lock:
            key = (series_id, step, window)
            memos = self._entries.get(key)
            memo = memos.get(fn) if memos else None
            if memo is None or memo.expires <= self.clock():
                return None
            self._entries.move_to_end(key)
            return memo

    def store(
        self,
        series_id: int,
        step: float,
        window: float,
        fn: str,
        first_t: float,
        values: Values,
        host_id: int,
        generation: int,
        renew: bool,
    ) -> None:
        """Keep `values` (instants first_t, first_t + step, ...: all final). Skipped when the host's
        data changed since `generation` was read. `renew`: computed from every point (a new ttl)."""
        arr = array("d", [_NAN if v is None else v for v in values])
        with self._lock:
            if self._gen[host_id] != generation:
                return
            key = (series_id, step, window)
            memos = self._entries.setdefault(key, {})
            old = memos.get(fn)
            expires = (
                (self.clock() + self.ttl_s * self._rng.uniform(0.75, 1.25)) if renew or old is None else old.expires
            )
            self._size += len(arr) - (len(old.values) if old else 0)
            memos[fn] = _Memo(first_t, arr, host_id, expires)
            self._by_host[host_id].add(key)
            self._entries.move_to_end(key)
            while self._size > self.max_values and len(self._entries) > 1:
                old_key, dropped = self._entries.popitem(last=False)
                self._size -= sum(len(m.values) for m in dropped.values())
                for m in dropped.values():
                    self._by_host[m.host_id].discard(old_key)

    def note_push(self, host_id: int, oldest_ts: float | None, now: float) -> None:
        """After a stored push: samples older than the freeze lag change final instants from their
        timestamp on (a value at t depends only on samples at or before t)."""
        if oldest_ts is not None and oldest_ts < now - self.freeze_lag_s:
            self.invalidate_host(host_id, since=oldest_ts)

    def invalidate_host(self, host_id: int, since: float = -math.inf) -> None:
        """Forget the host's final values at instants >= `since` (all of them by default)."""
        with self._lock:
            self._gen[host_id] += 1
            for key in list(self._by_host.get(host_id, ())):
                memos = self._entries.get(key)
                if memos is None:
                    self._by_host[host_id].discard(key)
                    continue
                step = key[1]
                for fn, m in list(memos.items()):
                    keep = max(0, math.ceil((since - m.first_t) / step - 1e-9)) if since > -math.inf else 0
                    if keep >= len(m.values):
                        continue
                    self._size -= len(m.values) - keep
                    if keep:
                        memos[fn] = _Memo(m.first_t, m.values[:keep], m.host_id, m.expires)
                    else:
                        del memos[fn]
                if not memos:
                    del self._entries[key]
                    self._by_host[host_id].discard(key)

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
    memo = h.cache.lookup(s.series_id, step, window, fn)
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
        h.cache.store(s.series_id, step, window, fn, times[0], out[:n_final], h.host_id, h.generation, renew=not head)
    return out


def derived_memo(series: Sequence[TieredSeries], tag: str) -> tuple[int, LiveHandle] | None:
    """For a value derived pointwise from several live series (a histogram's quantiles from its
    bucket rates): a memo key of its own (a negative id, apart from real series) and a handle
    to store with. None unless every series is live."""
    handles = [s.handle for s in series if isinstance(s, LiveRawSeries) and s.handle is not None]
    if not series or len(handles) != len(series):
        return None
    ids = ",".join(str(s.series_id) for s in sorted(series, key=lambda x: x.series_id))
    digest = hashlib.blake2b(f"{tag}:{ids}".encode(), digest_size=7).digest()
    return -1 - int.from_bytes(digest, "big"), handles[0]


def memo_head(
    handle: LiveHandle, key: int, times: Sequence[float], step: float, window: float, fns: Sequence[str]
) -> list[Values]:
    """The final values memoised for each of `fns` from times[0] on, cut to a common length."""
    heads: list[Values] = []
    for fn in fns:
        memo = handle.cache.lookup(key, step, window, fn)
        if memo is None or memo.first_t > times[0]:
            return [[] for _ in fns]
        heads.append(_head(memo, times, step))
    n = min(len(h) for h in heads)
    return [h[:n] for h in heads]


def memo_store(
    handle: LiveHandle,
    key: int,
    times: Sequence[float],
    step: float,
    window: float,
    values: dict[str, Values],
    renew: bool,
) -> None:
    n_final = _n_final(handle, times)
    if n_final:
        for fn, vals in values.items():
            handle.cache.store(
                key, step, window, fn, times[0], vals[:n_final], handle.host_id, handle.generation, renew=renew
            )


def _head(memo: _Memo | None, times: Sequence[float], step: float) -> Values:
    """The memo's final values at times[0], times[1], ... (as many as it holds; NaN -> None)."""
    if memo is None or memo.first_t > times[0]:
        return []
    k0 = round((times[0] - memo.first_t) / step)
    return [None if v != v else v for v in memo.values[k0 : k0 + len(times)]]


def _n_final(handle: LiveHandle, times: Sequence[float]) -> int:
    """How many of `times` are final (older than the freeze lag at the handle's `now`)."""
    return bisect_right(times, handle.now - handle.cache.freeze_lag_s)
