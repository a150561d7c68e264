"""The optimal-eviction (Belady) bound over a bounded window of recent block accesses.

The agent does not keep the stream's future, but the past of a bounded window is a complete
trace with known futures: ``AccessLog`` keeps the last ``max_accesses`` block accesses (64-bit
hashes in ``array('Q')``, 8 bytes each, whole requests), and ``bound`` replays that trace, from
an empty tier, three ways at each size:

- ``lru``: vLLM 0.32's LRU offload tier (``tier_bank.LruTier``: lookup from the GPU-hit boundary
  to the first miss, CHUNK_LEVEL offers, "cannot store chunks", re-rank last block first);
- ``opt``: the most block hits any tier of that many chunks could have had (Belady's MIN with
  bypass): a block can enter the tier when the request references it (a lookup, or a GPU-hit
  block offered), and the tier keeps, at every moment, the blocks whose next lookup comes
  soonest; a block whose next reference is only an offer is dropped at no cost (it can enter
  again then). Each stretch between two references of a block that ends in a lookup is an
  interval; OPT is the largest set of intervals of which at most C overlap anywhere, which the
  furthest-next-use rule finds (Belady 1966; interval scheduling on C machines);
- ``ceiling``: lookups whose block was referenced before in the window (an unbounded tier).

Where OPT's semantics differ from vLLM's tier, all in OPT's favour, so that it bounds every
policy: it counts each held block even after a miss earlier in the same request (vLLM's lookup
stops at the first miss), it may decline to store a block (vLLM stores every offered chunk it can
make room for), and it may take GPU-hit blocks of a request that loaded (vLLM offers only what
follows a load). So lru <= opt <= ceiling at every size; ``ceiling - opt`` is capacity (no policy
of that size gets it), ``opt - lru`` is policy (a better eviction order could). Chunk = block
(vLLM's default ``blocks_per_chunk`` 1), as in the rest of the model.
"""

from __future__ import annotations

import heapq
import threading
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from agent.kvevents.tier_bank import LruTier

DEFAULT_MAX_ACCESSES = 65_536  # ~0.5 MiB of hashes (+ a few bytes a request)
MAX_REQUEST_BLOCKS = 65_536
FULL_ENOUGH = 4_096  # accesses
BOUND_EVERY_S = 300.0  # a replay of the window costs seconds of one core: every 5 minutes at most


@dataclass(frozen=True, slots=True)
class BoundPoint:
    chunks: int
    lru: int  # blocks vLLM's LRU tier loaded over the window
    opt: int  # block hits of the optimal tier (an upper bound for every policy)
    ceiling: int  # lookups an unbounded tier could have served


class AccessLog:
    """The last ``max_accesses`` block accesses, as whole requests (oldest dropped first)."""

    def __init__(self, max_accesses: int = DEFAULT_MAX_ACCESSES) -> None:
        self.max_accesses = max(1, max_accesses)
        self._requests: deque[tuple[array[int], int]] = deque()  # (prefix then stored keys, len(prefix))
        self.accesses = 0
        self.added = 0  # accesses ever added (the log's clock)

    def add(self, prefix: Sequence[int], stored: Sequence[int]) -> None:
        """One request: its GPU-hit blocks (prefix order) and the blocks it stored (the lookups)."""
        if not stored and not prefix:
            return
        keys = array("Q", prefix[-MAX_REQUEST_BLOCKS:])
        keys.extend(stored[:MAX_REQUEST_BLOCKS])
        self._requests.append((keys, min(len(prefix), MAX_REQUEST_BLOCKS)))
        self.accesses += len(keys)
        self.added += len(keys)
        while self.accesses > self.max_accesses and len(self._requests) > 1:
            old, _ = self._requests.popleft()
            self.accesses -= len(old)

    def clear(self) -> None:
        self._requests.clear()
        self.accesses = 0

    def snapshot(self) -> list[tuple[array[int], int]]:
        """The requests as they are now (the arrays are not changed after ``add``)."""
        return list(self._requests)

    def nbytes(self) -> int:
        return sum(k.itemsize * len(k) + 64 for k, _ in self._requests)


def trace(requests: Sequence[tuple[Sequence[int], int]]) -> tuple[list[int], list[bool]]:
    """The window as one access sequence: each request's GPU-hit blocks (offers), then its stored
    blocks (lookups)."""
    keys: list[int] = []
    lookup: list[bool] = []
    for ks, n_prefix in requests:
        keys.extend(ks)
        lookup.extend([False] * n_prefix)
        lookup.extend([True] * (len(ks) - n_prefix))
    return keys, lookup


def _next_lookup(keys: Sequence[int], lookup: Sequence[bool]) -> list[int]:
    """For each access, the index of the block's next reference if that is a lookup, else -1
    (no next reference, or an offer: the block may leave now and enter again then)."""
    n = len(keys)
    out = [-1] * n
    nxt: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        k = keys[i]
        j = nxt.get(k)
        if j is not None and lookup[j]:
            out[i] = j
        nxt[k] = i
    return out


def opt_hits(keys: Sequence[int], lookup: Sequence[bool], capacity: int, nxt: Sequence[int] | None = None) -> int:
    """Belady's MIN with bypass: block hits of the best tier of ``capacity`` blocks."""
    if capacity <= 0:
        return 0
    nxt = _next_lookup(keys, lookup) if nxt is None else nxt
    held: dict[int, int] = {}  # block -> index of its next lookup
    heap: list[tuple[int, int]] = []  # (-next lookup, block): furthest first; stale entries skipped
    hits = 0
    for i, k in enumerate(keys):
        if lookup[i] and k in held:
            hits += 1
        j = nxt[i]
        if j < 0:
            held.pop(k, None)  # nothing to gain by holding it until its next reference
            continue
        held[k] = j
        heapq.heappush(heap, (-j, k))
        while len(held) > capacity:
            neg, victim = heapq.heappop(heap)
            if held.get(victim) == -neg:
                del held[victim]
        if len(heap) > 4 * capacity + 64:  # drop stale entries now and then
            heap = [(-j2, k2) for k2, j2 in held.items()]
            heapq.heapify(heap)
    return hits


def ceiling_hits(keys: Sequence[int], lookup: Sequence[bool]) -> int:
    seen: set[int] = set()
    hits = 0
    for k, is_lookup in zip(keys, lookup, strict=True):
        if is_lookup and k in seen:
            hits += 1
        seen.add(k)
    return hits


def lru_loaded(requests: Sequence[tuple[Sequence[int], int]], capacity: int) -> int:
    """What vLLM's LRU tier of ``capacity`` chunks loaded over the window, from empty."""
    tier = LruTier(capacity)
    total = 0
    for ks, n_prefix in requests:
        total += tier.serve(list(ks[:n_prefix]), list(ks[n_prefix:]))
    return total


def bound(requests: Sequence[tuple[Sequence[int], int]], capacities: Sequence[int]) -> list[BoundPoint]:
    """LRU, OPT and the ceiling over the window at each size (chunks). A size that holds every
    block of the window never evicts: it and every larger size share one replay."""
    keys, lookup = trace(requests)
    nxt = _next_lookup(keys, lookup)
    ceiling = ceiling_hits(keys, lookup)
    distinct = len(set(keys))
    out: list[BoundPoint] = []
    whole: tuple[int, int] | None = None
    for c in sorted({int(c) for c in capacities if c > 0}):
        if c >= distinct and whole is not None:
            out.append(BoundPoint(c, *whole, ceiling))
            continue
        point = BoundPoint(c, lru_loaded(requests, c), opt_hits(keys, lookup, c, nxt), ceiling)
        if c >= distinct:
            whole = (point.lru, point.opt)
        out.append(point)
    return out


def add_points(a: list[BoundPoint], b: list[BoundPoint]) -> list[BoundPoint]:
    """Two data-parallel ranks' bounds (each rank has its own tier) at the same sizes."""
    if not a:
        return b
    return [
        BoundPoint(x.chunks, x.lru + y.lru, x.opt + y.opt, x.ceiling + y.ceiling) for x, y in zip(a, b, strict=True)
    ]


class BoundWorker:
    """Runs ``bound`` on a snapshot of the logs on a thread of its own, at most every ``every_s``:
    off the receive thread and off the push. ``take`` hands the finished result over once."""

    def __init__(self, every_s: float = BOUND_EVERY_S) -> None:
        self.every_s = every_s
        self._next_at: float | None = None
        self._thread: threading.Thread | None = None
        self._result: tuple[list[BoundPoint], int] | None = None
        self._lock = threading.Lock()

    def due(self, now: float) -> bool:
        if self._thread is not None and self._thread.is_alive():
            return False
        return self._next_at is None or now >= self._next_at

    def start(self, snapshots: list[list[tuple[array[int], int]]], capacities: Sequence[int], now: float) -> None:
        accesses = sum(len(k) for snap in snapshots for k, _ in snap)
        if not accesses:
            return  # nothing to replay yet: try again at the next push
        # a log still filling is replayed again soon (a fresh agent's first bound covers little)
        self._next_at = now + (self.every_s if accesses >= FULL_ENOUGH else min(self.every_s, 30.0))
        caps = list(capacities)

        def work() -> None:
            points: list[BoundPoint] = []
            for snap in snapshots:
                points = add_points(points, bound(snap, caps))
            with self._lock:
                self._result = (points, accesses)

        self._thread = threading.Thread(target=work, name="kvscope-opt-bound", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def take(self) -> tuple[list[BoundPoint], int] | None:
        with self._lock:
            out, self._result = self._result, None
        return out
