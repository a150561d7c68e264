"""LRU reuse (stack) distances in one pass: Mattson's stack algorithm, exact or SHARDS-sampled.

The stack distance of a reference is the number of distinct *other* keys referenced since the
previous reference to the same key (None on a first reference). An LRU cache of C entries hits
a reference exactly when its distance is < C, so one pass gives the hit count of every size
(Mattson et al., 1970). Distances come from a Fenwick tree over reference times: O(log n) per
reference, n the number of distinct keys tracked (times are renumbered when the tree fills).

SHARDS (Waldspurger et al., FAST'15) tracks only keys whose mixed hash falls under a threshold
T out of P = 2^24, i.e. a rate R = T/P of the key space; a sampled distance d stands for d/R
real ones and each sampled reference for 1/R references. With ``max_keys`` set the threshold
is lowered whenever more keys than that are tracked (the keys with the highest hash leave), so
memory stays bounded whatever the number of distinct keys ("fixed-size" SHARDS); every
reference is weighted by 1/R at the rate it was sampled under. ``rate=1`` with no
``max_keys`` is the exact Mattson pass.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Sequence
from typing import Any

_P = 1 << 24
_LOW24 = _P - 1  # x % _P for x >= 0
_MASK64 = (1 << 64) - 1

# Histogram bins, in keys (blocks): width 1 below 64, then 16 per doubling up to 2^40.
_EXACT_BELOW = 64


def _edges() -> list[int]:
    edges = list(range(_EXACT_BELOW))
    k = 0
    while True:
        e = int(_EXACT_BELOW * 2 ** (k / 16))
        if e > 1 << 40:
            break
        if e > edges[-1]:
            edges.append(e)
        k += 1
    return edges


BIN_EDGES: list[int] = _edges()


def bin_lower(distance: float) -> int:
    """The lower edge of the histogram bin a distance falls in."""
    d = max(0, int(distance))
    return BIN_EDGES[bisect.bisect_right(BIN_EDGES, d) - 1]


def bin_upper(lower: int) -> int:
    i = bisect.bisect_left(BIN_EDGES, lower)
    if i + 1 < len(BIN_EDGES):
        return BIN_EDGES[i + 1]
    return lower * 2


def hits_at(histogram: dict[int, float], capacity: float) -> float:
    """References an LRU of ``capacity`` keys would hit: weight of distances < capacity.

    Width-1 bins are exact; wider bins count the part of the bin under the capacity, assuming
    distances spread evenly inside the bin.
    """
    total = 0.0
    for lower, weight in histogram.items():
        upper = bin_upper(lower)
        if capacity >= upper:
            total += weight
        elif capacity > lower:
            total += weight * (capacity - lower) / (upper - lower)
    return total


def mix64(key: int) -> int:
    """splitmix64's finaliser: spreads any 64-bit key evenly (sampling must not follow key structure)."""
    z = (key + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class _Fenwick:
    __slots__ = ("n", "tree")

    def __init__(self, n: int) -> None:
        self.n = n
        self.tree = [0] * (n + 1)

    def add(self, i: int, delta: int) -> None:
        i += 1
        tree, n = self.tree, self.n
        while i <= n:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum over positions 0..i inclusive."""
        i += 1
        s = 0
        tree = self.tree
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    @classmethod
    def of_ones(cls, count: int, n: int) -> _Fenwick:
        """A tree of size n with positions 0..count-1 set to 1 (built in O(n))."""
        f = cls(n)
        tree = f.tree
        for i in range(1, n + 1):
            if i <= count:
                tree[i] += 1
            j = i + (i & -i)
            if j <= n:
                tree[j] += tree[i]
        return f


class LruStack:
    """Mattson's stack: the LRU stack distance of each reference, O(log n) each."""

    __slots__ = ("_clock", "_last", "_tree")

    def __init__(self, initial: int = 1024) -> None:
        self._last: dict[int, int] = {}
        self._tree = _Fenwick(max(16, initial))
        self._clock = 0

    def __len__(self) -> int:
        return len(self._last)

    def _compact(self) -> None:
        order = sorted(self._last.items(), key=lambda kv: kv[1])
        self._last = {k: i for i, (k, _) in enumerate(order)}
        self._tree = _Fenwick.of_ones(len(order), max(1024, 2 * len(order) + 16))
        self._clock = len(order)

    def access(self, key: int) -> int | None:
        """Reference ``key``; return its stack distance (None on its first reference).

        The Fenwick tree's prefix sum and updates are inlined (this is the model's hot path)."""
        if self._clock >= self._tree.n:
            self._compact()
        last = self._last
        tree = self._tree.tree
        n = self._tree.n
        prev = last.get(key)
        dist = None
        if prev is not None:
            i = prev + 1
            s = 0
            while i > 0:
                s += tree[i]
                i &= i - 1
            dist = len(last) - s
            i = prev + 1
            while i <= n:
                tree[i] -= 1
                i += i & -i
        t = self._clock
        i = t + 1
        while i <= n:
            tree[i] += 1
            i += i & -i
        last[key] = t
        self._clock = t + 1
        return dist

    def touch(self, key: int) -> None:
        """``access`` without working out the distance (the model's re-rank needs none)."""
        if self._clock >= self._tree.n:
            self._compact()
        last = self._last
        tree = self._tree.tree
        n = self._tree.n
        prev = last.get(key)
        if prev is not None:
            i = prev + 1
            while i <= n:
                tree[i] -= 1
                i += i & -i
        t = self._clock
        i = t + 1
        while i <= n:
            tree[i] += 1
            i += i & -i
        last[key] = t
        self._clock = t + 1

    def distance(self, key: int) -> int | None:
        """The stack distance ``key`` would have now, without referencing it."""
        prev = self._last.get(key)
        if prev is None:
            return None
        tree = self._tree.tree
        i = prev + 1
        s = 0
        while i > 0:
            s += tree[i]
            i &= i - 1
        return len(self._last) - s

    def forget(self, key: int) -> None:
        prev = self._last.pop(key, None)
        if prev is not None:
            self._tree.add(prev, -1)

    def clear(self) -> None:
        self._last.clear()
        self._tree = _Fenwick(self._tree.n)
        self._clock = 0


class ReuseSampler:
    """Reuse distances of a reference stream, exact (rate 1) or SHARDS-sampled, bounded by ``max_keys``."""

    def __init__(self, rate: float = 1.0, max_keys: int | None = None) -> None:
        if not 0 < rate <= 1:
            raise ValueError("rate must be in (0, 1]")
        if max_keys is not None and max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self.threshold = max(1, round(rate * _P))
        self.max_keys = max_keys
        self.stack = LruStack()
        self._heap: list[tuple[int, int]] = []  # (-mixed hash bucket, key) of tracked keys
        self._bucket: dict[int, int] = {}

    @property
    def rate(self) -> float:
        return self.threshold / _P

    def sampled(self, key: int) -> bool:
        return mix64(key) % _P < self.threshold

    def access(self, key: int) -> tuple[bool, float | None, float]:
        """Reference ``key``: ``(sampled, scaled distance or None if first seen, weight)``.

        Unsampled keys answer ``(False, None, 0.0)``.
        """
        bucket = mix64(key) % _P
        if bucket >= self.threshold:
            return False, None, 0.0
        rate = self.threshold / _P
        dist = self.stack.access(key)
        if key not in self._bucket:
            self._bucket[key] = bucket
            if self.max_keys is not None:
                heapq.heappush(self._heap, (-bucket, key))
                self._shrink()
        scaled = None if dist is None else dist / rate
        return True, scaled, 1.0 / rate

    def peek(self, key: int) -> tuple[bool, float | None, float]:
        """Like ``access`` but without referencing ``key`` (the distance a lookup sees now)."""
        bucket = mix64(key) % _P
        if bucket >= self.threshold:
            return False, None, 0.0
        rate = self.threshold / _P
        dist = self.stack.distance(key)
        return True, (None if dist is None else dist / rate), 1.0 / rate

    def peek_all(self, keys: Sequence[int]) -> list[tuple[int, int, float | None, float]]:
        """``(key, bucket, scaled distance or None, weight)`` of each sampled key, as ``peek``
        would answer one at a time (nothing changes in between); mix64 and the Fenwick prefix
        sum inlined. The bucket goes back to ``access_buckets``: a key is hashed once."""
        threshold = self.threshold
        rate = threshold / _P
        weight = 1.0 / rate
        last = self.stack._last
        tree = self.stack._tree.tree
        n = len(last)
        out: list[tuple[int, int, float | None, float]] = []
        for key in keys:
            z = (key + 0x9E3779B97F4A7C15) & _MASK64
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
            bucket = (z ^ (z >> 31)) & _LOW24
            if bucket >= threshold:
                continue
            prev = last.get(key)
            if prev is None:
                out.append((key, bucket, None, weight))
                continue
            i = prev + 1
            total = 0
            while i > 0:
                total += tree[i]
                i &= i - 1
            out.append((key, bucket, (n - total) / rate, weight))
        return out

    def access_buckets(self, items: Iterable[tuple[int, int, Any, Any]]) -> None:
        """``access`` each ``(key, bucket, ...)`` in turn (the bucket is ``mix64(key) % P``); the
        threshold is checked at each, as it may drop on the way."""
        touch = self.stack.touch
        known = self._bucket
        for key, bucket, _, _ in items:
            if bucket >= self.threshold:
                continue
            touch(key)
            if key not in known:
                known[key] = bucket
                if self.max_keys is not None:
                    heapq.heappush(self._heap, (-bucket, key))
                    self._shrink()

    def access_all(self, keys: Iterable[int]) -> None:
        """``access`` each key in turn; a tracked key's bucket is known, others are hashed."""
        touch = self.stack.touch
        known = self._bucket
        for key in keys:
            bucket = known.get(key)
            if bucket is None:
                bucket = mix64(key) & _LOW24
                if bucket >= self.threshold:
                    continue
                touch(key)
                known[key] = bucket
                if self.max_keys is not None:
                    heapq.heappush(self._heap, (-bucket, key))
                    self._shrink()
            else:
                touch(key)  # tracked: under the threshold

    def _shrink(self) -> None:
        assert self.max_keys is not None
        while len(self._bucket) > self.max_keys:
            top = -self._heap[0][0]
            self.threshold = top  # keys with a bucket >= top are no longer sampled
            while self._heap and -self._heap[0][0] >= top:
                _, key = heapq.heappop(self._heap)
                self._bucket.pop(key, None)
                self.stack.forget(key)

    def forget_all(self) -> None:
        """A new epoch (restart, AllBlocksCleared): nothing referenced before can be reused."""
        self.stack.clear()
        self._heap.clear()
        self._bucket.clear()


def distances_histogram(
    keys: list[int], rate: float = 1.0, max_keys: int | None = None
) -> tuple[dict[int, float], float, float]:
    """``(histogram of scaled distances, weight of first references, total weight)`` of a key stream."""
    sampler = ReuseSampler(rate, max_keys)
    hist: dict[int, float] = {}
    cold = 0.0
    total = 0.0
    for k in keys:
        ok, dist, weight = sampler.access(k)
        if not ok:
            continue
        total += weight
        if dist is None:
            cold += weight
        else:
            b = bin_lower(dist)
            hist[b] = hist.get(b, 0.0) + weight
    return hist, cold, total
