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
tracked (older ones count as farther than any pool the page offers); publisher restarts and
``AllBlocksCleared`` start over. ``LeverModel`` is a TierModel that also keeps these distances
and puts them on each window (``ReuseWindow.pool_bins``).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

from agent.kvevents.decode import Batch, Cleared, Removed, Stored
from agent.kvevents.reuse import bin_lower
from agent.kvevents.tier_model import DEFAULT_MAX_KEYS, TierModel, is_gpu
from agent.protocol import ReuseWindow

POOL_MAX_KEYS = 32_768  # evicted blocks tracked per rank (~5 MiB); a pool 32k blocks larger is off the page
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
        self._slot[key] = self._clock
        self._add(self._clock, 1)
        self._clock += 1

    def take(self, key: int) -> int | None:
        """Remove ``key``; the number of blocks evicted after it and still out (None: not out)."""
        slot = self._slot.pop(key, None)
        if slot is None:
            return None
        after = len(self._slot) + 1 - self._prefix(slot)
        self._add(slot, -1)
        return after

    def clear(self) -> None:
        self._tree = [0] * len(self._tree)
        self._slot.clear()
        self._clock = 0


class PoolStack:
    """The evicted-and-not-back blocks of one rank, in eviction order (Mattson, with removal)."""

    __slots__ = ("_chains", "_n", "_order", "_serial", "dropped", "max_keys", "stack")

    def __init__(self, max_keys: int = POOL_MAX_KEYS) -> None:
        self.max_keys = max_keys
        self.stack = _OutStack()
        self._serial: dict[int, int] = {}
        self._order: deque[tuple[int, int]] = deque()
        self._n = 0
        self._chains: OrderedDict[int, float] = OrderedDict()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._serial)

    def evicted(self, h: int) -> None:
        self._n += 1
        self.stack.push(h)
        self._serial[h] = self._n
        self._order.append((h, self._n))
        while len(self._serial) > self.max_keys:
            k, s = self._order.popleft()
            if self._serial.get(k) == s:
                self.stack.take(k)
                del self._serial[k]
                self.dropped += 1
        if len(self._order) > 4 * max(1024, len(self._serial)):  # entries of blocks that came back
            self._order = deque((k, s) for k, s in self._order if self._serial.get(k) == s)

    def stored(self, h: int) -> float:
        """The eviction distance of a block stored again (inf: never evicted, or too long ago)."""
        if self._serial.pop(h, None) is None:
            return math.inf
        d = self.stack.take(h)
        return math.inf if d is None else float(d)

    def stored_chain(self, hashes: tuple[int, ...], parent: int | None) -> list[float]:
        """Distances of an event's blocks with vLLM's prefix rule (running max along the chain)."""
        running = self._chains.pop(parent, 0.0) if parent is not None else 0.0
        out = []
        for h in hashes:
            running = max(running, self.stored(h))
            out.append(running)
        if hashes:
            self._chains[hashes[-1]] = running
            if len(self._chains) > MAX_CHAINS:
                self._chains.popitem(last=False)
        return out

    def clear(self) -> None:
        self.stack.clear()
        self._serial.clear()
        self._order.clear()
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
    ) -> None:
        super().__init__(instance, now, rate=rate, max_keys=max_keys)
        self._pool_max_keys = pool_max_keys
        self._pools: dict[int, PoolStack] = {}
        self._pool_seq: dict[int, int] = {}
        self._pool_bins: dict[int, float] = {}

    def _pool(self, rank: int | None) -> PoolStack:
        key = rank or 0
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = PoolStack(self._pool_max_keys)
        return pool

    def observe(self, batch: Batch) -> None:
        super().observe(batch)
        if batch.replay_end:
            return
        rank = batch.dp_rank or 0
        pool = self._pool(rank)
        last = self._pool_seq.get(rank)
        if last is not None and batch.seq <= last:
            pool.clear()  # a restarted engine: its pool is empty
        self._pool_seq[rank] = batch.seq
        bins = self._pool_bins
        for ev in batch.events:
            if isinstance(ev, Removed) and is_gpu(ev.medium):
                for h in ev.hashes:
                    pool.evicted(h)
            elif isinstance(ev, Stored) and is_gpu(ev.medium):
                for d in pool.stored_chain(ev.hashes, ev.parent):
                    if not math.isinf(d):
                        b = bin_lower(d)
                        bins[b] = bins.get(b, 0.0) + 1.0
            elif isinstance(ev, Cleared):
                pool.clear()

    def take_window(self, now: float) -> ReuseWindow | None:
        w = super().take_window(now)
        bins, self._pool_bins = self._pool_bins, {}
        if w is not None:
            w.pool_bins = [[float(k), v] for k, v in sorted(bins.items())]
        return w
