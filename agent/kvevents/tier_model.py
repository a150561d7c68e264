"""One vLLM instance's KV-event stream -> what an LRU offload tier of any size would have served.

The model (docs/cache-sizing.md has the reasons):

- An offload tier sits behind the GPU prefix cache and is looked up only for blocks the GPU
  does not hold. vLLM publishes a GPU ``BlockStored`` for each block it computes *or* reloads
  into the prefix cache (a GPU hit publishes nothing), so the stream of GPU BlockStored blocks
  is the tier's lookup stream, and it is the same with or without a tier.
- The tier stores what the GPU computes (vLLM's OffloadingConnector stores every new block),
  so an LRU tier of C blocks holds a block looked up again iff its LRU stack distance in that
  stream is < C (Mattson).
- vLLM reloads only a contiguous prefix: a block counts only if every earlier block of its
  request (its chain, followed by ``parent_block_hash``) was also held, so each block is
  recorded with the running maximum of the distances along its chain.
- A block re-announced while it is still on the GPU (``kv_cache_report_mode="full"`` in 0.33)
  is a GPU hit, not a lookup: skipped and counted.
- Publisher restart (sequence goes back) and ``AllBlocksCleared`` start a new epoch: the GPU
  and tier contents are gone, so nothing before can be reused.

Memory is bounded by the SHARDS sampler's ``max_keys`` (plus a bounded chain table), whatever
the number of distinct blocks. Time is passed in (``now``); no sockets here.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from agent.kvevents.decode import Batch, Cleared, Removed, Stored
from agent.kvevents.reuse import ReuseSampler, bin_lower
from kvcore.protocol import ReuseWindow

DEFAULT_MAX_KEYS = 8_192  # ~3.5 MiB of tracking state; SHARDS mean error ~0.005 (bench/sizing.py)
MAX_CHAINS = 4_096
GPU = "GPU"


def is_gpu(medium: str | None) -> bool:
    """GPU-pool events (vLLM before 0.10.2 sent no medium: those are GPU too)."""
    return medium is None or medium.upper() == GPU


@dataclass
class _Window:
    start: float
    references: int = 0
    sampled: float = 0.0
    cold: float = 0.0
    reannounced: float = 0.0
    stored_tokens: int = 0
    messages: int = 0
    events: int = 0
    lost: int = 0
    garbage: int = 0
    epochs: int = 0
    tier_stored: int = 0
    tier_removed: int = 0

    def __post_init__(self) -> None:
        self.bins: dict[int, float] = {}


class TierModel:
    """Reuse distances of one instance (all its DP ranks: each rank has its own GPU pool)."""

    def __init__(self, instance: str, now: float, *, rate: float = 1.0, max_keys: int | None = DEFAULT_MAX_KEYS):
        self.instance = instance
        self._rate = rate
        self._max_keys = max_keys
        self._ranks: dict[int, _Rank] = {}
        self.block_size: int | None = None
        self._win = _Window(start=now)

    def _rank(self, rank: int | None) -> _Rank:
        key = rank or 0
        r = self._ranks.get(key)
        if r is None:
            if len(self._ranks) >= 64:  # a garbage rank number must not grow this without bound
                key = -1
                r = self._ranks.get(key)
            if r is None:
                r = self._ranks[key] = _Rank(ReuseSampler(self._rate, self._max_keys))
        return r

    def garbage(self, count: int = 1) -> None:
        """A frame the decoder refused."""
        self._win.garbage += count

    def lost(self, count: int) -> None:
        self._win.lost += max(0, count)

    def observe(self, batch: Batch) -> None:
        """Fold one decoded message (in sequence order per rank) into the model."""
        if batch.replay_end:
            return
        win = self._win
        win.messages += 1
        win.garbage += batch.skipped
        rank = self._rank(batch.dp_rank)
        if rank.last_seq is not None:
            if batch.seq <= rank.last_seq:  # the publisher started again: a restarted engine
                rank.new_epoch()
                win.epochs += 1
            elif batch.seq > rank.last_seq + 1:
                win.lost += batch.seq - rank.last_seq - 1
        rank.last_seq = batch.seq
        for ev in batch.events:
            win.events += 1
            if isinstance(ev, Stored):
                if not is_gpu(ev.medium):
                    win.tier_stored += len(ev.hashes)
                    continue
                if ev.block_size and ev.block_size > 0:  # tokens per block (placeholders carry no tokens)
                    self.block_size = ev.block_size
                win.stored_tokens += ev.n_tokens
                rank.stored(ev, win)
            elif isinstance(ev, Removed):
                if is_gpu(ev.medium):
                    rank.removed(ev)
                else:
                    win.tier_removed += len(ev.hashes)
            elif isinstance(ev, Cleared):
                rank.new_epoch()
                win.epochs += 1

    def tracked_keys(self) -> int:
        return sum(len(r.sampler.stack) for r in self._ranks.values())

    def rate(self) -> float:
        return min((r.sampler.rate for r in self._ranks.values()), default=self._rate)

    def take_window(self, now: float) -> ReuseWindow | None:
        """The window since the last call (None when nothing arrived), and start the next one."""
        win, self._win = self._win, _Window(start=now)
        if not win.messages and not win.garbage and not win.lost:
            return None
        return ReuseWindow(
            instance=self.instance,
            start=win.start,
            end=now,
            block_size=self.block_size,
            rate=self.rate(),
            references=win.references,
            sampled=win.sampled,
            cold=win.cold,
            reannounced=win.reannounced,
            bins=[[float(k), v] for k, v in sorted(win.bins.items())],
            stored_tokens=win.stored_tokens,
            messages=win.messages,
            events=win.events,
            lost=win.lost,
            garbage=win.garbage,
            epochs=win.epochs,
            tier_stored=win.tier_stored,
            tier_removed=win.tier_removed,
            tracked_keys=self.tracked_keys(),
        )


class _Rank:
    __slots__ = ("chains", "last_seq", "resident", "sampler")

    def __init__(self, sampler: ReuseSampler) -> None:
        self.sampler = sampler
        self.resident: set[int] = set()  # sampled blocks on the GPU now
        self.chains: OrderedDict[int, float] = OrderedDict()  # last block of a chain -> running max
        self.last_seq: int | None = None

    def new_epoch(self) -> None:
        self.sampler.forget_all()
        self.resident.clear()
        self.chains.clear()

    def stored(self, ev: Stored, win: _Window) -> None:
        sampler = self.sampler
        running = 0.0
        if ev.parent is not None:
            running = self.chains.pop(ev.parent, 0.0)
        for h in ev.hashes:
            win.references += 1
            if not sampler.sampled(h):
                continue
            if h in self.resident:  # re-announced GPU hit, not a tier lookup
                win.reannounced += 1.0 / sampler.rate
                continue
            ok, dist, weight = sampler.access(h)
            if not ok:
                continue
            self.resident.add(h)
            win.sampled += weight
            running = max(running, math.inf if dist is None else dist)
            if math.isinf(running):
                win.cold += weight
            else:
                b = bin_lower(running)
                win.bins[b] = win.bins.get(b, 0.0) + weight
        if ev.hashes:
            self.chains[ev.hashes[-1]] = running
            if len(self.chains) > MAX_CHAINS:
                self.chains.popitem(last=False)
        if len(self.resident) > 2 * max(1024, len(sampler.stack)):
            self.resident &= {h for h in self.resident if sampler.sampled(h)}

    def removed(self, ev: Removed) -> None:
        for h in ev.hashes:
            self.resident.discard(h)
