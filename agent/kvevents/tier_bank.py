"""Miniature simulation of vLLM's offload tier (LRU or ARC) at a grid of sizes (exact, not a stack pass).

vLLM's tier is not a pure stack algorithm, so one Mattson pass cannot give it exactly at small
sizes: a request whose new chunks the tier cannot make room for stores *nothing*
(``CPUOffloadingManager.prepare_store`` returns None when too few chunks outside the offer are
evictable), a request that loaded offers only the chunks after the loaded ones (CHUNK_LEVEL),
and one that loaded nothing offers all of its chunks, GPU hits included. Following
Waldspurger et al. (ATC'17, "miniature simulation"), each size of the grid runs the real policy;
here every size sees every request (no sampling), so the bank is exact at its sizes and its
memory is the sum of the sizes (``DEFAULT_CAPACITIES`` sums to ~21,000 chunks, ~3 MiB).

Per request, as vLLM 0.32 does it (tests/agent/kvevents/vllm_tier.py cites the functions):
lookup from the GPU-hit boundary to the first miss; load those; offer the rest (or everything
when nothing loaded); evict the least recent chunks not in the offer, or store nothing; at the
request's end re-rank its recorded chunks last block first.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence

# chunks; ~x1.41 apart up to 8,192 (larger sizes come from the stack-distance curve)
DEFAULT_CAPACITIES: tuple[int, ...] = tuple(sorted({round(16 * 2 ** (i / 2)) for i in range(19)}))
MAX_CAPACITIES = 64
MAX_CAPACITY = 1 << 16


class LruTier:
    """One vLLM LRU CPU tier of ``capacity`` chunks (front of ``order`` = least recent)."""

    __slots__ = ("capacity", "failed", "inserted", "order")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.order: OrderedDict[int, None] = OrderedDict()
        self.failed = 0  # requests whose store found no room (vLLM: "cannot store chunks")
        self.inserted = 0  # chunks stored (a size added mid-stream is warm once it stored its capacity)

    def size(self) -> int:
        return len(self.order)

    def copy_from(self, other: LruTier) -> None:
        self.order = OrderedDict(other.order)

    def plan(self, prefix: Sequence[int], stored: Sequence[int]) -> tuple[int, list[int], list[int]]:
        """(chunks loaded, chunks offered, new chunks among them), changing nothing."""
        order = self.order
        loaded = 0
        for k in stored:
            if k not in order:
                break
            loaded += 1
        offer = list(stored[loaded:]) if loaded else [*prefix, *stored]
        return loaded, offer, [k for k in offer if k not in order]

    def serve(
        self,
        prefix: Sequence[int],
        stored: Sequence[int],
        planned: tuple[int, Sequence[int], list[int]] | None = None,
        fresh: dict[int, None] | None = None,
    ) -> int:
        """A request: its GPU-hit chunks (``prefix``) and the chunks it stored; returns chunks loaded.

        ``plan`` inlined. ``fresh``, when the bank gives it, is ``dict.fromkeys(reversed([*prefix,
        *stored]))`` of a request that names no chunk twice: then the common case, a request of
        which this tier holds nothing, is a few C calls (nothing loads, the whole request is offered
        and new, nothing is protected, so the victims are the least recent chunks; the chunks
        enter last block first, the order on_request_finished leaves them in; without room the
        tier stays as it was)."""
        order = self.order
        if planned is None:
            loaded = 0
            for k in stored:
                if k not in order:
                    break
                loaded += 1
            if loaded:
                offer: Sequence[int] = stored[loaded:]
            elif fresh is not None and order.keys().isdisjoint(fresh):
                need = len(order) + len(fresh) - self.capacity
                if need > 0:
                    if need > len(order):
                        self.failed += 1
                        return 0
                    pop = order.popitem
                    for _ in range(need):
                        pop(False)
                order.update(fresh)
                self.inserted += len(fresh)
                return 0
            else:
                offer = [*prefix, *stored]
            new = [k for k in offer if k not in order]
        else:
            loaded, offer, new = planned
        need = len(order) + len(new) - self.capacity
        if need > 0:
            if len(new) == len(offer):  # none of the offer is here: nothing is protected
                if need > len(order):
                    self.failed += 1
                    new = []
                else:
                    pop = order.popitem
                    for _ in range(need):
                        pop(False)
            else:
                protected = set(offer)
                if len(order) - (len(protected) - len(set(new))) < need:  # evictable: not offered
                    self.failed += 1
                    new = []
                else:
                    # the least recent chunks not offered go; an offered one met on the way is put
                    # back anywhere: it is re-ranked below (the offer is part of what is re-ranked)
                    pop = order.popitem
                    held = []
                    while need:
                        k = pop(False)[0]
                        if k in protected:
                            held.append(k)
                        else:
                            need -= 1
                    for k in held:
                        order[k] = None
        for k in new:
            order[k] = None
        self.inserted += len(new)
        # on_request_finished: recorded chunks (loaded, offered and present) re-ranked, last first
        move = order.move_to_end
        for k in reversed(stored if loaded else offer):
            try:
                move(k)
            except KeyError:  # offered but not stored (no room), or a loaded chunk evicted
                pass
        return loaded

    def clear(self) -> None:
        self.order.clear()


class ArcTier:
    """One vLLM ARC CPU tier (``vllm/v1/kv_offload/cpu/policies/arc.py`` ``ARCCachePolicy`` under
    ``CPUOffloadingManager``): new chunks enter T1; a request's reused chunks move to T2 at its end
    (last block first); store misses found in the ghost lists B1/B2 move the T1 target first;
    eviction takes T1's least recent while T1 is at or over the target, else T2's, skipping the
    offer, and the evicted become ghosts (each ghost list bounded by the capacity)."""

    __slots__ = ("b1", "b2", "capacity", "failed", "inserted", "t1", "t2", "target")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.target = 0.0
        self.failed = 0
        self.inserted = 0

    def size(self) -> int:
        return len(self.t1) + len(self.t2)

    def copy_from(self, other: ArcTier) -> None:
        self.t1, self.t2 = OrderedDict(other.t1), OrderedDict(other.t2)
        self.b1, self.b2 = OrderedDict(other.b1), OrderedDict(other.b2)
        self.target = other.target

    def _has(self, k: int) -> bool:
        return k in self.t1 or k in self.t2

    def plan(self, prefix: Sequence[int], stored: Sequence[int]) -> tuple[int, list[int], list[int]]:
        loaded = 0
        for k in stored:
            if not self._has(k):
                break
            loaded += 1
        offer = list(stored[loaded:]) if loaded else [*prefix, *stored]
        return loaded, offer, [k for k in offer if not self._has(k)]

    def _ghost_hit(self, k: int) -> None:
        if k in self.b1:
            self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
            self.b1.move_to_end(k)
        elif k in self.b2:
            self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
            self.b2.move_to_end(k)

    def _evict(self, n: int, protected: set[int]) -> bool:
        victims: list[tuple[int, bool]] = []
        virtual_t1 = len(self.t1)
        t1 = (k for k in self.t1 if k not in protected)
        t2 = (k for k in self.t2 if k not in protected)
        for _ in range(n):
            pick: tuple[int, bool] | None = None
            if virtual_t1 >= int(self.target):
                k = next(t1, None)
                if k is not None:
                    pick, virtual_t1 = (k, True), virtual_t1 - 1
            if pick is None:
                k = next(t2, None)
                if k is not None:
                    pick = (k, False)
            if pick is None:
                k = next(t1, None)
                if k is None:
                    return False
                pick, virtual_t1 = (k, True), virtual_t1 - 1
            victims.append(pick)
        for k, from_t1 in victims:
            if from_t1:
                del self.t1[k]
                self.b1[k] = None
            else:
                del self.t2[k]
                self.b2[k] = None
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)
        return True

    def serve(
        self, prefix: Sequence[int], stored: Sequence[int], planned: tuple[int, list[int], list[int]] | None = None
    ) -> int:
        loaded, offer, new = planned or self.plan(prefix, stored)
        reused = set(stored[:loaded])  # prepare_load
        reused.update(k for k in offer if self._has(k))  # prepare_store: ready chunks offered again
        for k in reversed(new):  # on_store_miss: the ghost lists adapt the T1 target
            self._ghost_hit(k)
        inserted: list[int] = []
        need = self.size() + len(new) - self.capacity
        if need <= 0 or self._evict(need, set(offer)):
            for k in new:
                self.t1[k] = None
                self.b1.pop(k, None)
                self.b2.pop(k, None)
            inserted = new
            self.inserted += len(new)
        else:
            self.failed += 1
        ins = set(inserted)
        for k in reversed([*stored[:loaded], *offer] if loaded else offer):  # on_request_finished
            if k in ins:
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


Tier = LruTier | ArcTier
POLICIES = ("lru", "arc")


class TierBank:
    """Tiers from small to large. Those that have never had to evict hold the same chunks, so only
    the smallest of them (the leader) is run and the larger ones take its answer; when the leader
    must evict, the next size gets a copy of its state first and leads from then on. A stream
    whose working set fits the smaller sizes costs a few tiers' work, not the whole grid's."""

    def __init__(self, capacities: Sequence[int] = DEFAULT_CAPACITIES, policy: str = "lru") -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown eviction policy {policy!r}")
        caps = sorted({int(c) for c in capacities if 0 < int(c) <= MAX_CAPACITY})[:MAX_CAPACITIES]
        kind = LruTier if policy == "lru" else ArcTier
        self.tiers: list[Tier] = [kind(c) for c in caps]
        self._lru = policy == "lru"
        self._leader = 0  # tiers[leader:] have never evicted: only tiers[leader] holds their state
        self._warming: dict[int, int] = {}  # a size added mid-stream, seeded -> chunks it must store first

    @property
    def capacities(self) -> list[int]:
        return [t.capacity for t in self.tiers]

    def serve(self, prefix: Sequence[int], stored: Sequence[int]) -> list[int]:
        """Chunks each size loaded for this request (the prefix is given last block first)."""
        out = [0] * len(self.tiers)
        self.serve_into(prefix, stored, out)
        return out

    def serve_into(self, prefix: Sequence[int], stored: Sequence[int], acc: list[int]) -> None:
        """``serve``, adding each size's loaded chunks to ``acc`` (one slot per tier)."""
        pre = list(reversed(prefix))
        tiers = self.tiers
        leader = self._leader
        if leader:
            if self._lru:
                whole = [*pre, *stored]
                rev = dict.fromkeys(reversed(whole))
                fresh = rev if len(rev) == len(whole) else None  # a chunk named twice: the general path
                for i in range(leader):
                    n = tiers[i].serve(pre, stored, None, fresh)  # type: ignore[call-arg]
                    if n:
                        acc[i] += n
            else:
                for i in range(leader):
                    n = tiers[i].serve(pre, stored)
                    if n:
                        acc[i] += n
        while self._leader < len(tiers):
            i = self._leader
            lead = tiers[i]
            planned = lead.plan(pre, stored)
            if lead.size() + len(planned[2]) > lead.capacity and i + 1 < len(tiers):
                tiers[i + 1].copy_from(lead)  # type: ignore[arg-type]  # the next size leads from here
                self._leader += 1
                acc[i] += lead.serve(pre, stored, planned)
                continue
            if lead.size() + len(planned[2]) > lead.capacity:
                self._leader += 1  # the largest size evicts too: every tier runs on its own now
                acc[i] += lead.serve(pre, stored, planned)
                break
            n = lead.serve(pre, stored, planned)
            if n:
                for j in range(i, len(tiers)):
                    acc[j] += n
            break

    def add(self, capacity: int) -> bool | None:
        """Add a size mid-stream (the instance's own tier, say); None when it is not added (there
        already, out of range, the bank full). True when it starts exact, holding what a tier of
        that size run on the whole stream would: it is above the leader (no size that large has
        evicted, so it shares the leader's state) or the leader's state fits it. Else it is seeded
        with the most recent chunks of the next larger size (LRU; ARC starts empty) and is *warm*
        only once it has stored its capacity in chunks (``cold``): vLLM's tier is not a stack
        algorithm, so a smaller size's state is not the larger one's most recent chunks."""
        c = int(capacity)
        caps = self.capacities
        if c in caps or not 0 < c <= MAX_CAPACITY or len(caps) >= MAX_CAPACITIES:
            return None
        k = bisect.bisect(caps, c)
        tier: Tier = LruTier(c) if self._lru else ArcTier(c)
        tiers, leader = self.tiers, self._leader
        exact = k > leader
        if k == leader < len(tiers) and tiers[leader].size() <= c:
            tier.copy_from(tiers[leader])  # type: ignore[arg-type]  # the new leader
            exact = True
        if not exact:  # k <= leader: it would have evicted by now, so it runs on its own
            if isinstance(tier, LruTier):
                nearest = tiers[k] if k < len(tiers) else tiers[-1] if tiers else None  # next larger, else largest
                if isinstance(nearest, LruTier):
                    keys = list(nearest.order)[-c:]
                    tier.order = OrderedDict.fromkeys(keys)
            self._leader += 1
            self._warming[c] = tier.inserted + c
        tiers.insert(k, tier)
        return exact

    def cold(self) -> set[int]:
        """Sizes added mid-stream (``add``) that have not yet stored their capacity since."""
        done = [c for c, need in self._warming.items() if self._tier(c).inserted >= need]
        for c in done:
            del self._warming[c]
        return set(self._warming)

    def _tier(self, capacity: int) -> Tier:
        return next(t for t in self.tiers if t.capacity == capacity)

    def clear(self) -> None:
        for t in self.tiers:
            t.clear()
        self._leader = 0
        self._warming.clear()  # an empty bank: every size starts alike

    def entries(self) -> int:
        return sum(t.size() for t in self.tiers[: self._leader + 1])
