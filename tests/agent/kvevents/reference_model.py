"""The tier model as it was before it was made fast: the tests' reference for its results.

A plain copy of the logic of agent/kvevents/tier_model.py, tier_bank.py, reuse.py (the sampler)
and pool_model.py (the GPU pool's eviction stack) at the time the speed work began (issue 27,
item 8), written for being obviously right rather than fast:

- every tier of the bank serves every request on its own (no leader shared by the tiers that
  have not evicted yet);
- the LRU stack is a list (most recent last): a distance is the number of keys after the key;
- the GPU pool's evicted-and-not-back blocks are a list in eviction order;
- no caches, no inlining, no fast paths.

tests/agent/kvevents/test_model_equivalence.py holds the optimised model to EXACTLY these
windows (points, bins, counters), on random and recorded streams. The semantics are the
model's (docs/cache-sizing.md "The method"); tests/agent/kvevents/vllm_tier.py is the separate
check that they are vLLM's.
"""

from __future__ import annotations

import bisect
import heapq
import math
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from agent.kvevents.decode import Batch, Cleared, Removed, Stored
from kvcore.protocol import ReuseWindow

# the model's constants (agent/kvevents/tier_model.py, tier_bank.py, pool_model.py, opt_bound.py)
MAX_CHAINS = 4_096
MAX_PARENTS = 32_768
MAX_PREFIX_WALK = 8_192
MAX_GAP = 1_000_000
STALE_AFTER_S = 10.0
CONTINUE_BATCHES = 2
DEFAULT_MAX_KEYS = 8_192
DEFAULT_CAPACITIES: tuple[int, ...] = tuple(sorted({round(16 * 2 ** (i / 2)) for i in range(19)}))
MAX_CAPACITIES = 64
MAX_CAPACITY = 1 << 16
POOL_MAX_KEYS = 8_192
DEFAULT_MAX_ACCESSES = 65_536
MAX_REQUEST_BLOCKS = 65_536
_P = 1 << 24
_MASK64 = (1 << 64) - 1


def _edges() -> list[int]:
    edges = list(range(64))
    k = 0
    while True:
        e = int(64 * 2 ** (k / 16))
        if e > 1 << 40:
            break
        if e > edges[-1]:
            edges.append(e)
        k += 1
    return edges


BIN_EDGES = _edges()


def bin_lower(distance: float) -> int:
    d = max(0, int(distance))
    return BIN_EDGES[bisect.bisect_right(BIN_EDGES, d) - 1]


def mix64(key: int) -> int:
    z = (key + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def is_gpu(medium: str | None) -> bool:
    return medium is None or medium.upper() == "GPU"


# --- Mattson's stack, SHARDS-sampled ----------------------------------------------------------


class ListStack:
    """LRU stack as a list, most recent last: distance = keys referenced after the key."""

    def __init__(self) -> None:
        self.keys: list[int] = []

    def __len__(self) -> int:
        return len(self.keys)

    def distance(self, key: int) -> int | None:
        if key not in self.keys:
            return None
        return len(self.keys) - 1 - self.keys.index(key)

    def access(self, key: int) -> int | None:
        d = self.distance(key)
        if d is not None:
            self.keys.remove(key)
        self.keys.append(key)
        return d

    def forget(self, key: int) -> None:
        if key in self.keys:
            self.keys.remove(key)

    def clear(self) -> None:
        self.keys.clear()


class RefSampler:
    def __init__(self, rate: float = 1.0, max_keys: int | None = None) -> None:
        self.threshold = max(1, round(rate * _P))
        self.max_keys = max_keys
        self.stack = ListStack()
        self.heap: list[tuple[int, int]] = []
        self.bucket: dict[int, int] = {}

    @property
    def rate(self) -> float:
        return self.threshold / _P

    def access(self, key: int) -> None:
        bucket = mix64(key) % _P
        if bucket >= self.threshold:
            return
        self.stack.access(key)
        if key not in self.bucket:
            self.bucket[key] = bucket
            if self.max_keys is not None:
                heapq.heappush(self.heap, (-bucket, key))
                while len(self.bucket) > self.max_keys:
                    top = -self.heap[0][0]
                    self.threshold = top
                    while self.heap and -self.heap[0][0] >= top:
                        _, k = heapq.heappop(self.heap)
                        self.bucket.pop(k, None)
                        self.stack.forget(k)

    def peek(self, key: int) -> tuple[bool, float | None, float]:
        bucket = mix64(key) % _P
        if bucket >= self.threshold:
            return False, None, 0.0
        rate = self.threshold / _P
        d = self.stack.distance(key)
        return True, (None if d is None else d / rate), 1.0 / rate

    def forget_all(self) -> None:
        self.stack.clear()
        self.heap.clear()
        self.bucket.clear()


# --- vLLM's tiers ------------------------------------------------------------------------------


class RefLruTier:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.order: OrderedDict[int, None] = OrderedDict()  # front = least recent
        self.failed = 0

    def serve(self, prefix: Sequence[int], stored: Sequence[int]) -> int:
        order = self.order
        loaded = 0
        for k in stored:
            if k not in order:
                break
            loaded += 1
        offer = list(stored[loaded:]) if loaded else [*prefix, *stored]
        new = [k for k in offer if k not in order]
        need = len(order) + len(new) - self.capacity
        if need > 0:
            victims = [k for k in order if k not in offer][:need]
            if len(victims) < need:
                self.failed += 1
                new = []
            else:
                for k in victims:
                    del order[k]
        for k in new:
            order[k] = None
        for k in reversed(stored if loaded else offer):
            if k in order:
                order.move_to_end(k)
        return loaded

    def clear(self) -> None:
        self.order.clear()


class RefArcTier:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.target = 0.0
        self.failed = 0

    def has(self, k: int) -> bool:
        return k in self.t1 or k in self.t2

    def size(self) -> int:
        return len(self.t1) + len(self.t2)

    def _evict(self, n: int, protected: set[int]) -> bool:
        victims: list[tuple[int, bool]] = []
        virtual_t1 = len(self.t1)
        t1 = [k for k in self.t1 if k not in protected]
        t2 = [k for k in self.t2 if k not in protected]
        for _ in range(n):
            if virtual_t1 >= int(self.target) and t1:
                victims.append((t1.pop(0), True))
                virtual_t1 -= 1
            elif t2:
                victims.append((t2.pop(0), False))
            elif t1:
                victims.append((t1.pop(0), True))
                virtual_t1 -= 1
            else:
                return False
        for k, from_t1 in victims:
            if from_t1:
                del self.t1[k]
                self.b1[k] = None
            else:
                del self.t2[k]
                self.b2[k] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.capacity:
                ghost.popitem(last=False)
        return True

    def serve(self, prefix: Sequence[int], stored: Sequence[int]) -> int:
        loaded = 0
        for k in stored:
            if not self.has(k):
                break
            loaded += 1
        offer = list(stored[loaded:]) if loaded else [*prefix, *stored]
        new = [k for k in offer if not self.has(k)]
        reused = set(stored[:loaded]) | {k for k in offer if self.has(k)}
        for k in reversed(new):
            if k in self.b1:
                self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
                self.b1.move_to_end(k)
            elif k in self.b2:
                self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(k)
        inserted: list[int] = []
        need = self.size() + len(new) - self.capacity
        if need <= 0 or self._evict(need, set(offer)):
            for k in new:
                self.t1[k] = None
                self.b1.pop(k, None)
                self.b2.pop(k, None)
            inserted = new
        else:
            self.failed += 1
        for k in reversed([*stored[:loaded], *offer] if loaded else offer):
            if k in inserted:
                if k in self.t1:
                    self.t1.move_to_end(k)
                elif k in self.t2:
                    self.t2.move_to_end(k)
            elif k in reused:
                if k in self.t1:
                    del self.t1[k]
                    self.t2[k] = None
                elif k in self.t2:
                    self.t2.move_to_end(k)
        return loaded

    def clear(self) -> None:
        for d in (self.t1, self.t2, self.b1, self.b2):
            d.clear()
        self.target = 0.0


def bank_capacities(capacities: Sequence[int]) -> list[int]:
    return sorted({int(c) for c in capacities if 0 < int(c) <= MAX_CAPACITY})[:MAX_CAPACITIES]


class RefBank:
    """Every tier serves every request, on its own."""

    def __init__(self, capacities: Sequence[int], policy: str = "lru") -> None:
        kind = RefLruTier if policy == "lru" else RefArcTier
        self.tiers: list[RefLruTier | RefArcTier] = [kind(c) for c in bank_capacities(capacities)]

    def serve(self, prefix_last_first: Sequence[int], stored: Sequence[int]) -> list[int]:
        prefix = list(reversed(prefix_last_first))
        return [t.serve(prefix, stored) for t in self.tiers]

    def clear(self) -> None:
        for t in self.tiers:
            t.clear()


class RefAccessLog:
    def __init__(self, max_accesses: int) -> None:
        self.max_accesses = max(1, max_accesses)
        self.requests: deque[tuple[array[int], int]] = deque()
        self.accesses = 0

    def add(self, prefix: Sequence[int], stored: Sequence[int]) -> None:
        if not stored and not prefix:
            return
        keys = array("Q", prefix[-MAX_REQUEST_BLOCKS:])
        keys.extend(stored[:MAX_REQUEST_BLOCKS])
        self.requests.append((keys, min(len(prefix), MAX_REQUEST_BLOCKS)))
        self.accesses += len(keys)
        while self.accesses > self.max_accesses and len(self.requests) > 1:
            old, _ = self.requests.popleft()
            self.accesses -= len(old)

    def clear(self) -> None:
        self.requests.clear()
        self.accesses = 0


# --- the model -----------------------------------------------------------------------------------


class RefWindow:
    def __init__(self, start: float) -> None:
        self.start = start
        self.c: dict[str, Any] = dict.fromkeys(
            (
                "references",
                "stored_tokens",
                "messages",
                "events",
                "lost",
                "garbage",
                "epochs",
                "tier_stored",
                "tier_removed",
                "duplicates",
                "stale_messages",
                "stale_tokens",
                "other_group_blocks",
            ),
            0,
        )
        self.sampled = 0.0
        self.cold = 0.0
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.bins: dict[int, float] = {}
        self.points: dict[int, int] = {}
        self.arc_points: dict[int, int] = {}


class RefRank:
    def __init__(self, model: RefTierModel) -> None:
        self.sampler = RefSampler(model.rate_arg, model.max_keys)
        self.bank = RefBank(model.caps)
        self.arc_bank = RefBank(model.caps, "arc") if model.arc else None
        self.log = RefAccessLog(model.opt_accesses) if model.opt_accesses > 0 else None
        self.chains: OrderedDict[int, tuple[float, int]] = OrderedDict()
        self.parents: OrderedDict[int, int] = OrderedDict()  # oldest link first
        self.last_seq: int | None = None
        self.last_ts: float | None = None
        self.suspect_seq: int | None = None
        self.batches = 0

    def new_epoch(self) -> None:
        self.sampler.forget_all()
        self.bank.clear()
        if self.arc_bank is not None:
            self.arc_bank.clear()
        self.chains.clear()
        self.parents.clear()
        if self.log is not None:
            self.log.clear()

    def gpu_prefix(self, parent: int | None) -> list[int]:
        out: list[int] = []
        h = parent
        while h is not None and h not in out and len(out) < MAX_PREFIX_WALK:
            out.append(h)
            h = self.parents.get(h)
        return out

    def stored(self, ev: Stored, win: RefWindow) -> None:
        running = 0.0
        prefix: list[int] = []
        cont = self.chains.pop(ev.parent, None) if ev.parent is not None else None
        if cont is not None and self.batches - cont[1] <= CONTINUE_BATCHES:
            running = cont[0]
        else:
            prefix = self.gpu_prefix(ev.parent)
        prev = ev.parent
        lookups = []
        for h in ev.hashes:
            if prev is not None:
                self.parents[h] = prev  # a dict: a link set again keeps its place in the order
                if len(self.parents) > MAX_PARENTS:
                    self.parents.popitem(last=False)
            prev = h
            win.c["references"] += 1
            ok, dist, weight = self.sampler.peek(h)
            if ok:
                lookups.append((h, dist, weight))
        has_bank = bool(self.bank.tiers) or bool(self.log)
        bank_prefix = prefix if prefix or not has_bank else self.gpu_prefix(ev.parent)
        if self.log is not None:
            self.log.add(bank_prefix[::-1], list(ev.hashes))
        if self.bank.tiers:
            for tier, n in zip(self.bank.tiers, self.bank.serve(bank_prefix, ev.hashes), strict=True):
                win.points[tier.capacity] = win.points.get(tier.capacity, 0) + n
            if self.arc_bank is not None:
                for tier, n in zip(self.arc_bank.tiers, self.arc_bank.serve(bank_prefix, ev.hashes), strict=True):
                    win.arc_points[tier.capacity] = win.arc_points.get(tier.capacity, 0) + n
        for _h, dist, weight in lookups:
            win.sampled += weight
            running = max(running, math.inf if dist is None else dist)
            if math.isinf(running):
                win.cold += weight
            else:
                b = bin_lower(running)
                win.bins[b] = win.bins.get(b, 0.0) + weight
        for h, _, _ in reversed(lookups):
            self.sampler.access(h)
        for h in prefix:
            self.sampler.access(h)
        if ev.hashes:
            self.chains[ev.hashes[-1]] = (running, self.batches)
            if len(self.chains) > MAX_CHAINS:
                self.chains.popitem(last=False)


class RefTierModel:
    def __init__(
        self,
        instance: str,
        now: float,
        *,
        rate: float = 1.0,
        max_keys: int | None = DEFAULT_MAX_KEYS,
        capacities: Sequence[int] = DEFAULT_CAPACITIES,
        arc: bool = False,
        opt_accesses: int = DEFAULT_MAX_ACCESSES,
    ) -> None:
        self.instance = instance
        self.rate_arg = rate
        self.max_keys = max_keys
        self.caps = bank_capacities(capacities)
        self.arc = arc
        self.opt_accesses = opt_accesses
        self.ranks: dict[int, RefRank] = {}
        self.block_size: int | None = None
        self.groups: set[int] = set()
        self.win = RefWindow(now)

    def rank(self, rank: int | None) -> RefRank:
        key = rank or 0
        if key not in self.ranks and len(self.ranks) >= 64:
            key = -1
        if key not in self.ranks:
            self.ranks[key] = RefRank(self)
        return self.ranks[key]

    def garbage(self, count: int = 1) -> None:
        self.win.c["garbage"] += count

    def lost(self, count: int) -> None:
        self.win.c["lost"] += max(0, count)

    def in_sequence(self, rank: RefRank, batch: Batch) -> bool:
        c = self.win.c
        if rank.last_seq is None:
            return True
        if batch.seq <= rank.last_seq:
            if rank.last_ts is not None and batch.ts > rank.last_ts:
                rank.new_epoch()
                c["epochs"] += 1
                return True
            c["duplicates"] += 1
            return False
        gap = batch.seq - rank.last_seq - 1
        if gap > MAX_GAP:
            if rank.suspect_seq is not None and batch.seq == rank.suspect_seq + 1:
                rank.suspect_seq = None
                return True
            rank.suspect_seq = batch.seq
            c["garbage"] += 1
            return False
        c["lost"] += gap
        return True

    def observe(self, batch: Batch, now: float | None = None) -> None:
        if batch.replay_end:
            return
        win = self.win
        rank = self.rank(batch.dp_rank)
        if not self.in_sequence(rank, batch):
            return
        rank.suspect_seq = None
        rank.last_seq = batch.seq
        rank.last_ts = batch.ts if rank.last_ts is None else max(rank.last_ts, batch.ts)
        rank.batches += 1
        stale = now is not None and now - batch.ts > STALE_AFTER_S
        count = RefWindow(0.0) if stale else win
        count.c["messages"] += 1
        count.c["garbage"] += batch.skipped
        if not stale:
            win.first_ts = batch.ts if win.first_ts is None else min(win.first_ts, batch.ts)
            win.last_ts = batch.ts if win.last_ts is None else max(win.last_ts, batch.ts)
        for ev in batch.events:
            count.c["events"] += 1
            if isinstance(ev, Stored):
                if not is_gpu(ev.medium):
                    count.c["tier_stored"] += len(ev.hashes)
                    continue
                self.groups.add(ev.group_idx)
                if ev.group_idx != 0:
                    count.c["other_group_blocks"] += len(ev.hashes)
                    continue
                if ev.block_size and ev.block_size > 0:
                    self.block_size = ev.block_size
                count.c["stored_tokens"] += ev.n_tokens
                rank.stored(ev, count)
            elif isinstance(ev, Removed):
                if not is_gpu(ev.medium):
                    count.c["tier_removed"] += len(ev.hashes)
            elif isinstance(ev, Cleared):
                rank.new_epoch()
                win.c["epochs"] += 1
        if stale:
            win.c["stale_messages"] += 1
            win.c["stale_tokens"] += count.c["stored_tokens"]
            win.c["garbage"] += count.c["garbage"]

    def opt_snapshot(self) -> list[list[tuple[Any, int]]]:
        return [list(r.log.requests) for r in self.ranks.values() if r.log is not None and r.log.accesses]

    def tracked_keys(self) -> int:
        return sum(len(r.sampler.stack) for r in self.ranks.values())

    def rate(self) -> float:
        return min((r.sampler.rate for r in self.ranks.values()), default=self.rate_arg)

    def take_window(self, now: float) -> ReuseWindow | None:
        win, self.win = self.win, RefWindow(now)
        c = win.c
        if not (c["messages"] or c["garbage"] or c["lost"] or c["stale_messages"] or c["duplicates"]):
            return None
        caps = self.caps
        return ReuseWindow(
            instance=self.instance,
            start=win.start,
            end=now,
            block_size=self.block_size,
            rate=self.rate(),
            sampled=win.sampled,
            cold=win.cold,
            bins=[[float(k), v] for k, v in sorted(win.bins.items())],
            tracked_keys=self.tracked_keys(),
            kv_groups=max(1, len(self.groups)),
            first_ts=win.first_ts,
            last_ts=win.last_ts,
            points=[[float(x), float(win.points.get(x, 0))] for x in caps],
            arc_points=[[float(x), float(win.arc_points.get(x, 0))] for x in caps] if self.arc else [],
            **c,
        )


# --- the GPU pool's eviction distances (pool_model.py) -----------------------------------------


class RefPoolStack:
    def __init__(self, max_keys: int = POOL_MAX_KEYS) -> None:
        self.max_keys = max_keys
        self.threshold = _P
        self.out: list[int] = []  # evicted and not back, in eviction order
        self.bucket: dict[int, int] = {}
        self.heap: list[tuple[int, int]] = []
        self.chains: OrderedDict[int, float] = OrderedDict()

    def take(self, key: int) -> int | None:
        if key not in self.out:
            return None
        i = self.out.index(key)
        self.out.pop(i)
        return len(self.out) - i

    def evicted(self, h: int) -> None:
        bucket = mix64(h) % _P
        if bucket >= self.threshold:
            return
        self.take(h)
        self.out.append(h)
        if h not in self.bucket:
            self.bucket[h] = bucket
            heapq.heappush(self.heap, (-bucket, h))
        while len(self.out) > self.max_keys:
            top = -self.heap[0][0]
            self.threshold = top
            while self.heap and -self.heap[0][0] >= top:
                _, k = heapq.heappop(self.heap)
                self.bucket.pop(k, None)
                self.take(k)
        if len(self.heap) > 4 * max(1024, len(self.out)):
            self.heap = [(-b, k) for k, b in self.bucket.items()]
            heapq.heapify(self.heap)

    def stored_chain(self, hashes: tuple[int, ...], parent: int | None) -> list[tuple[float, float]]:
        running = self.chains.pop(parent, 0.0) if parent is not None else 0.0
        out = []
        for h in hashes:
            if mix64(h) % _P >= self.threshold:
                continue
            rate = self.threshold / _P
            self.bucket.pop(h, None)
            d = self.take(h)
            running = max(running, math.inf if d is None else d / rate)
            out.append((running, 1.0 / rate))
        if hashes:
            self.chains[hashes[-1]] = running
            if len(self.chains) > MAX_CHAINS:
                self.chains.popitem(last=False)
        return out

    def clear(self) -> None:
        self.out.clear()
        self.bucket.clear()
        self.heap.clear()
        self.chains.clear()


class RefLeverModel(RefTierModel):
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
        self.pool_max_keys = pool_max_keys
        self.pools: dict[int, RefPoolStack] = {}
        self.pool_bins: dict[int, float] = {}

    def observe(self, batch: Batch, now: float | None = None) -> None:
        if batch.replay_end:
            return
        tier_rank = self.rank(batch.dp_rank)
        last_seq, taken = tier_rank.last_seq, tier_rank.batches
        super().observe(batch, now)
        if tier_rank.batches == taken:
            return
        key = batch.dp_rank or 0
        if key not in self.pools:
            self.pools[key] = RefPoolStack(self.pool_max_keys)
        pool = self.pools[key]
        if last_seq is not None and batch.seq <= last_seq:
            pool.clear()
        stale = now is not None and now - batch.ts > STALE_AFTER_S
        for ev in batch.events:
            if getattr(ev, "group_idx", 0) != 0:
                continue
            if isinstance(ev, Removed) and is_gpu(ev.medium):
                for h in ev.hashes:
                    pool.evicted(h)
            elif isinstance(ev, Stored) and is_gpu(ev.medium):
                for d, w in pool.stored_chain(ev.hashes, ev.parent):
                    if not stale and not math.isinf(d):
                        b = bin_lower(d)
                        self.pool_bins[b] = self.pool_bins.get(b, 0.0) + w
            elif isinstance(ev, Cleared):
                pool.clear()

    def take_window(self, now: float) -> ReuseWindow | None:
        w = super().take_window(now)
        bins, self.pool_bins = self.pool_bins, {}
        if w is not None:
            w.pool_bins = [[float(k), v] for k, v in sorted(bins.items())]
        return w
