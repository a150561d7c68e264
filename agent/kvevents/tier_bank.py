"""Miniature simulation of vLLM's LRU offload tier at a grid of sizes (exact, not a stack pass).

vLLM's tier is not a pure stack algorithm, so one Mattson pass cannot give it exactly at small
sizes: a request whose new chunks the tier cannot make room for stores *nothing*
(``CPUOffloadingManager.prepare_store`` returns None when too few chunks outside the offer are
evictable), a request that loaded offers only the chunks after the loaded ones (CHUNK_LEVEL),
and one that loaded nothing offers all of its chunks, GPU hits included. Following
Waldspurger et al. (ATC'17, "miniature simulation"), each size of the grid runs the real policy;
here every size sees every request (no sampling), so the bank is exact at its sizes and its
memory is the sum of the sizes (``DEFAULT_CAPACITIES`` sums to ~21,000 chunks, ~3 MiB).

Per request, as vLLM 0.32 does it (tests/sizing/vllm_tier.py cites the functions):
lookup from the GPU-hit boundary to the first miss; load those; offer the rest (or everything
when nothing loaded); evict the least recent chunks not in the offer, or store nothing; at the
request's end re-rank its recorded chunks last block first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

# chunks; ~x1.41 apart up to 8,192 (larger sizes come from the stack-distance curve)
DEFAULT_CAPACITIES: tuple[int, ...] = tuple(sorted({round(16 * 2 ** (i / 2)) for i in range(19)}))
MAX_CAPACITIES = 64
MAX_CAPACITY = 1 << 16


class LruTier:
    """One vLLM LRU CPU tier of ``capacity`` chunks (front of ``order`` = least recent)."""

    __slots__ = ("capacity", "failed", "order")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.order: OrderedDict[int, None] = OrderedDict()
        self.failed = 0  # requests whose store found no room (vLLM: "cannot store chunks")

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
        self, prefix: Sequence[int], stored: Sequence[int], planned: tuple[int, list[int], list[int]] | None = None
    ) -> int:
        """A request: its GPU-hit chunks (``prefix``) and the chunks it stored; returns chunks loaded."""
        order = self.order
        loaded, offer, new = planned or self.plan(prefix, stored)
        need = len(order) + len(new) - self.capacity
        if need > 0:
            protected = set(offer)
            victims = []
            for k in order:
                if k not in protected:
                    victims.append(k)
                    if len(victims) == need:
                        break
            if len(victims) < need:
                self.failed += 1
                new = []
            else:
                for k in victims:
                    del order[k]
        for k in new:
            order[k] = None
        # on_request_finished: recorded chunks (loaded, offered and present) re-ranked, last first
        move = order.move_to_end
        for k in reversed(stored if loaded else offer):
            try:
                move(k)
            except KeyError:  # offered but not stored (no room): not in the tier
                pass
        return loaded

    def clear(self) -> None:
        self.order.clear()


class TierBank:
    """Tiers from small to large. Those that have never had to evict hold the same chunks, so only
    the smallest of them (the leader) is run and the larger ones take its answer; when the leader
    must evict, the next size gets a copy of its state first and leads from then on. A stream
    whose working set fits the smaller sizes costs a few tiers' work, not the whole grid's."""

    def __init__(self, capacities: Sequence[int] = DEFAULT_CAPACITIES) -> None:
        caps = sorted({int(c) for c in capacities if 0 < int(c) <= MAX_CAPACITY})[:MAX_CAPACITIES]
        self.tiers = [LruTier(c) for c in caps]
        self._leader = 0  # tiers[leader:] have never evicted: only tiers[leader] holds their state

    @property
    def capacities(self) -> list[int]:
        return [t.capacity for t in self.tiers]

    def serve(self, prefix: Sequence[int], stored: Sequence[int]) -> list[int]:
        """Chunks each size loaded for this request (the prefix is given last block first)."""
        pre = list(reversed(prefix))
        tiers = self.tiers
        out = [t.serve(pre, stored) for t in tiers[: self._leader]]
        while self._leader < len(tiers):
            lead = tiers[self._leader]
            planned = lead.plan(pre, stored)
            if len(lead.order) + len(planned[2]) > lead.capacity and self._leader + 1 < len(tiers):
                tiers[self._leader + 1].order = OrderedDict(lead.order)  # the next size leads from here
                self._leader += 1
                out.append(lead.serve(pre, stored, planned))
                continue
            if len(lead.order) + len(planned[2]) > lead.capacity:
                self._leader += 1  # the largest size evicts too: every tier runs on its own now
                out.append(lead.serve(pre, stored, planned))
                break
            n = lead.serve(pre, stored, planned)
            out.extend([n] * (len(tiers) - self._leader))
            break
        return out

    def clear(self) -> None:
        for t in self.tiers:
            t.clear()
        self._leader = 0

    def entries(self) -> int:
        return sum(len(t.order) for t in self.tiers[: self._leader + 1])
