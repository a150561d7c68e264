"""What a larger GPU pool would have kept, from the same KV-event stream (the GPU-pool levers).

A CPU tier is asked for blocks in the order the GPU *stores* them (agent/kvevents/tier_model.py);
a larger GPU pool is not: its extra blocks hold what the pool *evicted* most recently. With LRU
inclusion, a pool of P + D blocks holds what the pool of P holds plus the D blocks most recently
evicted and not brought back since. So a block stored again after vLLM evicted it (GPU
``BlockRemoved``, then ``BlockStored``) would have stayed in a pool larger by D blocks iff fewer
than D distinct blocks were evicted after it and are still out: its *eviction distance*. One
pass over the stream gives the histogram of those distances, hence the GPU hits of every pool
size (``--kv-cache-dtype fp8``, ``--kv-cache-memory-bytes``, ``--gpu-memory-utilization``).

Like vLLM's prefix cache, a block counts only if its whole prefix would have stayed (the running
maximum along its request's chain). Memory: at most ``max_keys`` evicted blocks per rank are
tracked, SHARDS-sampled beyond that like the tier model (exact at rate 1); publisher restarts
and ``AllBlocksCleared`` start over. ``LeverModel`` is a TierModel that also keeps these distances
and puts them on each window (``ReuseWindow.pool_bins``).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

from agent.kvevents.decode import Batch, Cleared, Removed, Stored
from agent.kvevents.reuse import bin_lower, mix64
from agent.kvevents.tier_model import DEFAULT_MAX_KEYS, STALE_AFTER_S, TierModel, is_gpu
from kvcore.protocol import ReuseWindow

POOL_MAX_KEYS = 8_192  # evicted blocks tracked per rank, then SHARDS-sampled (as the tier model)
_P = 1 << 24
MAX_CHAINS = 4_096


class _OutStack:
    """Evicted blocks in eviction order, with removal: how many are still out after a given one
    (a Fenwick tree over eviction slots; one tree update per eviction and per return)."""

    __slots__ = ("_clock", "_slot", "_tree")

    def __init__(self, size: int = 1024) -> None:
        self._tree = [0] * (size + 1)
        self._slot: dict[int, int] = {}
        self._clock = 0

    def __len__(self) -> int:
        return len(self._slot)

    def _add(self, i: int, delta: int) -> None:
        tree, n = self._tree, len(self._tree)
        i += 1
        while i < n:
            tree[i] += delta
            i += i & -i

    def _prefix(self, i: int) -> int:
        tree, total = self._tree, 0
        i += 1
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total

    def _compact(self) -> None:
        order = sorted(self._slot.items(), key=lambda kv: kv[1])
        size = max(1024, 2 * len(order) + 16)
        self._tree = [0] * (size + 1)
        self._slot = {}
        for i, (k, _) in enumerate(order):
            self._slot[k] = i
            self._add(i, 1)
        self._clock = len(order)

    def push(self, key: int) -> None:
        if key in self._slot:
            self.take(key)
        if self._clock >= len(self._tree) - 1:
            self._compact()
        t = self._clock
        self._slot[key] = t
        tree = self._tree
        n = len(tree)
        i = t + 1
        while i < n:
            tree[i] += 1
            i += i & -i
        self._clock = t + 1

    def take(self, key: int) -> int | None:
        """Remove ``key``; the number of blocks evicted after it and still out (None: not out).

        The Fenwick tree's prefix sum and update are inlined (once per eviction and per return)."""
        slot = self._slot.pop(key, None)
        if slot is None:
            return None
        tree = self._tree
        i = slot + 1
        total = 0
        while i > 0:
            total += tree[i]
            i &= i - 1
        after = len(self._slot) + 1 - total
        n = len(tree)
        i = slot + 1
        while i < n:
            tree[i] -= 1
            i += i & -i
        return after

    def clear(self) -> None:
        self._tree = [0] * len(self._tree)
        self._slot.clear()
        self._clock = 0


class PoolStack:
    """The evicted-and-not-back blocks of one rank, SHARDS-sampled like the tier model (fixed
    size: when more than ``max_keys`` are out, the sampling threshold drops and the blocks with
    the highest mixed hash leave; a sampled distance d stands for d/R, a sampled hit for 1/R)."""

    __slots__ = ("_bucket", "_chains", "_heap", "max_keys", "stack", "threshold")

    def __init__(self, max_keys: int = POOL_MAX_KEYS) -> None:
        self.max_keys = max_keys
        self.threshold = _P
        self.stack = _OutStack()
        self._bucket: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []  # (-mixed hash bucket, key) of the blocks out
        self._chains: OrderedDict[int, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self.stack)

    @property
    def rate(self) -> float:
        return self.threshold / _P

    def evicted(self, h: int) -> None:
        bucket = mix64(h) % _P
        if bucket >= self.threshold:
            return
        self.stack.push(h)
        if h not in self._bucket:
            self._bucket[h] = bucket
            heapq.heappush(self._heap, (-bucket, h))
        while len(self.stack) > self.max_keys:
            top = -self._heap[0][0]
            self.threshold = top  # blocks with a bucket >= top are no longer sampled
            while self._heap and -self._heap[0][0] >= top:
                _, k = heapq.heappop(self._heap)
                self._bucket.pop(k, None)
                self.stack.take(k)
        if len(self._heap) > 4 * max(1024, len(self.stack)):  # entries of blocks that came back
            self._heap = [(-b, k) for k, b in self._bucket.items()]
            heapq.heapify(self._heap)

    def stored(self, h: int) -> tuple[float, float]:
        """(scaled eviction distance, weight) of a block stored again: weight 0 when it is not
        sampled, distance inf when it was never evicted (or left the sample)."""
        bucket = mix64(h) % _P
        if bucket >= self.threshold:
            return math.inf, 0.0
        rate = self.threshold / _P
        self._bucket.pop(h, None)
        d = self.stack.take(h)
        return (math.inf if d is None else d / rate), 1.0 / rate

    def stored_chain(self, hashes: tuple[int, ...], parent: int | None) -> list[tuple[float, float]]:
        """(distance, weight) of an event's blocks with vLLM's prefix rule: the running maximum
        along the chain (unsampled blocks carry it on, weightless)."""
        running = self._chains.pop(parent, 0.0) if parent is not None else 0.0
        out = []
        for h in hashes:
            d, w = self.stored(h)
            if w:
                running = max(running, d)
                out.append((running, w))
        if hashes:
            self._chains[hashes[-1]] = running
            if len(self._chains) > MAX_CHAINS:
                self._chains.popitem(last=False)
        return out

    def clear(self) -> None:
        self.stack.clear()
        self._bucket.clear()
        self._heap.clear()
        self._chains.clear()


class LeverModel(TierModel):
    """A TierModel that also keeps the GPU pool's eviction distances (ReuseWindow.pool_bins)."""

    def __init__(
        self,
        instance: str,
        now: float,
        *,
        rate: float = 1.0,
        max_keys: int | None = DEFAULT_MAX_KEYS,
        pool_max_keys: int = POOL_MAX_KEYS,
        arc: bool = False,
    ) -> None:
        super().__init__(instance, now, rate=rate, max_keys=max_keys, arc=arc)
        self._pool_max_keys = pool_max_keys
        self._pools: dict[int, PoolStack] = {}
        self._pool_bins: dict[int, float] = {}

    def _pool(self, rank: int | None) -> PoolStack:
        key = rank or 0
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = PoolStack(self._pool_max_keys)
        return pool

    def observe(self, batch: Batch, now: float | None = None) -> None:
        """The tier model's fold, then the pool's: only for a batch the tier model took (a duplicate
        or a garbage sequence is skipped there, a lower sequence with a newer vLLM timestamp is a
        restarted engine, whose pool is empty); a backlog batch (older than STALE_AFTER_S on
        arrival) moves the pool's state but adds no distances, as it adds no counts there."""
        if batch.replay_end:
            super().observe(batch, now)
            return
        tier_rank = self._rank(batch.dp_rank)
        last_seq, taken = tier_rank.last_seq, tier_rank.batches
        super().observe(batch, now)
        if tier_rank.batches == taken:
            return  # skipped by the tier model
        pool = self._pool(batch.dp_rank)
        if last_seq is not None and batch.seq <= last_seq:
            pool.clear()
        stale = now is not None and now - batch.ts > STALE_AFTER_S
        bins = self._pool_bins
        for ev in batch.events:
            if getattr(ev, "group_idx", 0) != 0:
                continue  # the other KV-cache groups of a hybrid model (the tier model counts group 0)
            if isinstance(ev, Removed) and is_gpu(ev.medium):
                for h in ev.hashes:
                    pool.evicted(h)
            elif isinstance(ev, Stored) and is_gpu(ev.medium):
                for d, w in pool.stored_chain(ev.hashes, ev.parent):
                    if not stale and not math.isinf(d):
                        b = bin_lower(d)
                        bins[b] = bins.get(b, 0.0) + w
            elif isinstance(ev, Cleared):
                pool.clear()

    def take_window(self, now: float) -> ReuseWindow | None:
        w = super().take_window(now)
        bins, self._pool_bins = self._pool_bins, {}
        if w is not None:
            w.pool_bins = [[float(k), v] for k, v in sorted(bins.items())]
        return w
