"""One vLLM instance's KV-event stream -> what vLLM's LRU offload tier of any size would have served.

The model follows vLLM's OffloadingConnector (0.32; docs/cache-sizing.md has the reasons and
tests/agent/kvevents/vllm_tier.py the reference re-implementation):

- A request's chunks are its GPU-hit prefix (published nothing, found back through
  ``parent_block_hash`` and the parents of blocks seen before) plus the blocks it stored (GPU
  ``BlockStored``: computed or reloaded). The tier is looked up from the GPU-hit boundary, so the
  stored blocks are the lookups; a block counts only if every earlier stored block of its request
  was held too (the running maximum of the distances along the chain).
- When nothing loads, vLLM offers every chunk of the request to the tier, GPU hits included, and
  at the request's end re-ranks them *last block first* (``LRUCachePolicy.on_request_finished``),
  so the first block ends the most recent. The model references a request's chunks in that
  order, after taking every lookup's distance as it stood when the request arrived; one pass
  of Mattson's stack algorithm still gives the hits of every size.
- A block announced again while another copy of it is on the GPU is a lookup like any other:
  vLLM (default ``kv_cache_report_mode="incremental"``) announces a block only when a request
  computed or loaded it, and ``BlockPool.cache_full_blocks`` does not de-duplicate (NOTE #1).
  The second copy comes from a request scheduled before the first copy was cached, most often
  while another request *loads* the same prefix (``allocate_slots(delay_cache_blocks=True)``:
  loaded blocks are cached only when the load completes), so that request looked the tier up
  too and loaded the prefix a second time, and ``external_kv_transfer`` counts both loads.
  (Requests that ask for ``kv_cache_report_mode="full"`` re-announce their GPU hits; the model
  takes those for lookups too: docs/cache-sizing.md.)
- Only KV-cache group 0 is a lookup stream; other groups (hybrid models) are counted: each
  group takes its own slot in the tier, which the app divides the capacity by.
- A publisher restart (the sequence goes back with a newer vLLM timestamp) and
  ``AllBlocksCleared`` start a new epoch; a message seen again (same or older sequence, not
  newer) is a duplicate and skipped; a batch older than ``STALE_AFTER_S`` by its own vLLM
  timestamp when it arrives (a backlog vLLM queued while nobody listened) updates the cache
  state but is left out of the window's counts, which therefore cover the span [first_ts,
  last_ts] the app reconciles against vLLM's ``local_compute`` counter.

Memory is bounded by the SHARDS sampler's ``max_keys`` plus bounded chain and parent tables,
whatever the number of distinct blocks. Time is passed in (``now``); no sockets here.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from agent.kvevents.decode import Batch, Cleared, Removed, Stored
from agent.kvevents.opt_bound import DEFAULT_MAX_ACCESSES, AccessLog
from agent.kvevents.reuse import ReuseSampler, bin_lower
from agent.kvevents.tier_bank import DEFAULT_CAPACITIES, MAX_CAPACITIES, MAX_CAPACITY, TierBank
from kvcore.protocol import ReuseWindow

DEFAULT_MAX_KEYS = 8_192  # ~3.5 MiB of tracking state; SHARDS mean error ~0.005 (bench/sizing.py)
MAX_CHAINS = 4_096
MAX_PARENTS = 32_768  # block -> parent links kept to find a request's GPU-hit prefix (~3.5 MiB)
MAX_PREFIX_WALK = 8_192  # blocks walked back from a GPU-hit parent
MAX_GAP = 1_000_000  # a sequence jump beyond this is a garbage seq, not that many lost messages
STALE_AFTER_S = 10.0  # a batch this much older than its arrival is a backlog, not "now"
CONTINUE_BATCHES = 2  # an event extending a chain stored this recently continues that request
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
    stored_tokens: int = 0
    messages: int = 0
    events: int = 0
    lost: int = 0
    garbage: int = 0
    epochs: int = 0
    tier_stored: int = 0
    tier_removed: int = 0
    duplicates: int = 0
    stale_messages: int = 0
    stale_tokens: int = 0
    other_group_blocks: int = 0
    first_ts: float | None = None
    last_ts: float | None = None

    def __post_init__(self) -> None:
        self.bins: dict[int, float] = {}
        self.points: list[int] = []  # per tier of the bank (capacities order): chunks it loaded
        self.arc_points: list[int] = []  # the same for vLLM's ARC policy (when asked for)

    def points_of(self, tiers: int) -> list[int]:
        if not self.points:
            self.points = [0] * tiers
        return self.points

    def arc_points_of(self, tiers: int) -> list[int]:
        if not self.arc_points:
            self.arc_points = [0] * tiers
        return self.arc_points


class TierModel:
    """Reuse distances of one instance (all its DP ranks: each rank has its own GPU pool)."""

    def __init__(
        self,
        instance: str,
        now: float,
        *,
        rate: float = 1.0,
        max_keys: int | None = DEFAULT_MAX_KEYS,
        capacities: tuple[int, ...] | list[int] | range = DEFAULT_CAPACITIES,
        arc: bool = False,
        opt_accesses: int = DEFAULT_MAX_ACCESSES,
    ):
        """``capacities``: the tier sizes (chunks) simulated exactly; () for the stack curve only.
        ``opt_accesses``: the recent block accesses kept for the optimal-eviction bound (0: none).
        ``arc``: simulate vLLM's ARC policy at those sizes too (``eviction_policy: arc`` tiers,
        where an LRU curve is not valid)."""
        self._arc = arc
        self._opt_accesses = opt_accesses
        self.instance = instance
        self._capacities = tuple(TierBank(capacities).capacities)
        self._rate = rate
        self._max_keys = max_keys
        self._ranks: dict[int, _Rank] = {}
        self.block_size: int | None = None
        self.groups: set[int] = set()
        self._win = _Window(start=now)
        self._wanted: tuple[int, int] | None = None  # (chunks, tokens per chunk) of the instance's own tier
        self._held_back: set[int] = set()  # sizes this window leaves out: added during it, or still warming

    def _rank(self, rank: int | None) -> _Rank:
        key = rank or 0
        r = self._ranks.get(key)
        if r is None:
            if len(self._ranks) >= 64:  # a garbage rank number must not grow this without bound
                key = -1
                r = self._ranks.get(key)
            if r is None:
                r = self._ranks[key] = _Rank(
                    ReuseSampler(self._rate, self._max_keys),
                    TierBank(self._capacities),
                    TierBank(self._capacities, "arc") if self._arc else None,
                    AccessLog(self._opt_accesses) if self._opt_accesses > 0 else None,
                )
        return r

    def want_capacity(self, chunks: int, chunk_tokens: int) -> None:
        """The instance's own CPU tier (``cpu_num_chunks`` and ``offload_block_size`` of
        ``vllm:kv_offload_config_info``): simulated as a size of its own from the next window on,
        so the curve is exact at the size the instance runs, not interpolated. Taken only where a
        chunk is one event block (``offload_block_size`` equals the events' block size) of one
        KV-cache group; applied at the next GPU store (once the block size is known) or when the
        window is taken, both under the subscriber's lock."""
        self._wanted = (int(chunks), int(chunk_tokens))

    def _take_wanted(self) -> None:
        wanted, self._wanted = self._wanted, None
        if wanted is None or self.block_size is None:
            self._wanted = wanted  # no event yet: the block size is not known
            return
        chunks, tokens = wanted
        if tokens == self.block_size and len(self.groups) <= 1:
            self.add_capacity(chunks)

    def add_capacity(self, chunks: int) -> bool:
        """Simulate one more size from now on (False: there already, out of range, bank full).
        Where every bank knows its state exactly and a size beside it has never evicted, the
        window it is added in takes that size's loads so far (the same, chunk for chunk);
        else that window leaves it out (it saw only part of it), and so does every window until
        each rank's tier of that size is warm (TierBank.add). Before the first event (no rank
        yet) it is exact outright."""
        caps = self._capacities
        c = int(chunks)
        if c in caps or not 0 < c <= MAX_CAPACITY or len(caps) >= MAX_CAPACITIES:
            return False
        k = bisect.bisect(caps, c)
        self._capacities = (*caps[:k], c, *caps[k:])
        banks = [b for r in self._ranks.values() for b in (r.bank, r.arc_bank) if b is not None]
        exact = all([b.add(c) is True for b in banks])  # a list: every bank gets the size
        # Exact means it sits in every bank's never-evicted group (TierBank.add), beside the
        # largest size (or, when it is the largest, the one below): that twin has held every
        # chunk stored, as the new size would have, so its loads so far are the new size's.
        # (vLLM publishes kv_offload_config_info only after its first step, so the size comes
        # after the window served requests; the twin keeps that window whole.)
        twin = len(caps) - 1 if k < len(caps) else k - 1  # in the old list
        for pts in (self._win.points, self._win.arc_points):
            if pts:
                pts.insert(k, pts[twin] if exact else 0)
        if not exact:
            self._held_back.add(c)  # seeded: out of this window and until warm
        return True

    def garbage(self, count: int = 1) -> None:
        """A frame the decoder refused."""
        self._win.garbage += count

    def lost(self, count: int) -> None:
        self._win.lost += max(0, count)

    def _sequence(self, rank: _Rank, batch: Batch) -> bool:
        """Check the batch's place in its rank's sequence; False when it must be skipped."""
        win = self._win
        last = rank.last_seq
        if last is None:
            return True
        if batch.seq <= last:
            if rank.last_ts is not None and batch.ts > rank.last_ts:  # newer, lower seq: restarted
                rank.new_epoch()
                win.epochs += 1
                return True
            win.duplicates += 1  # seen before (a replay answering twice, a resent message)
            return False
        gap = batch.seq - last - 1
        if gap > MAX_GAP:
            if rank.suspect_seq is not None and batch.seq == rank.suspect_seq + 1:
                rank.suspect_seq = None
                return True  # two in a row: the publisher really is there now
            rank.suspect_seq = batch.seq
            win.garbage += 1
            return False
        win.lost += gap
        return True

    def observe(self, batch: Batch, now: float | None = None) -> None:
        """Fold one decoded message (in sequence order per rank) into the model.

        ``now`` is when it arrived (the agent's clock, on vLLM's host): a batch whose own vLLM
        timestamp is more than ``STALE_AFTER_S`` older is a backlog and is not counted as now."""
        if batch.replay_end:
            return
        win = self._win
        rank = self._rank(batch.dp_rank)
        if not self._sequence(rank, batch):
            return
        rank.suspect_seq = None
        rank.last_seq = batch.seq
        rank.last_ts = batch.ts if rank.last_ts is None else max(rank.last_ts, batch.ts)
        rank.batches += 1
        stale = now is not None and now - batch.ts > STALE_AFTER_S
        count = _Window(start=0.0) if stale else win  # a stale batch changes state, not the counts
        count.messages += 1
        count.garbage += batch.skipped
        if not stale:
            win.first_ts = batch.ts if win.first_ts is None else min(win.first_ts, batch.ts)
            win.last_ts = batch.ts if win.last_ts is None else max(win.last_ts, batch.ts)
        for ev in batch.events:
            count.events += 1
            if isinstance(ev, Stored):
                if not is_gpu(ev.medium):
                    count.tier_stored += len(ev.hashes)
                    continue
                self.groups.add(ev.group_idx)
                if ev.group_idx != 0:
                    count.other_group_blocks += len(ev.hashes)
                    continue
                if ev.block_size and ev.block_size > 0:  # tokens per block (placeholders carry no tokens)
                    self.block_size = ev.block_size
                if self._wanted is not None:  # the own size, as soon as the block size is known
                    self._take_wanted()
                count.stored_tokens += ev.n_tokens
                rank.stored(ev, count)
            elif isinstance(ev, Removed):
                if not is_gpu(ev.medium):
                    count.tier_removed += len(ev.hashes)
            elif isinstance(ev, Cleared):
                rank.new_epoch()
                win.epochs += 1
        if stale:
            win.stale_messages += 1
            win.stale_tokens += count.stored_tokens
            win.garbage += count.garbage

    def opt_snapshot(self) -> list[list[tuple[Any, int]]]:
        """Each rank's window of recent requests, for the optimal-eviction bound (opt_bound.py)."""
        return [r.log.snapshot() for r in self._ranks.values() if r.log is not None and r.log.accesses]

    @property
    def capacities(self) -> tuple[int, ...]:
        return self._capacities or DEFAULT_CAPACITIES

    def tracked_keys(self) -> int:
        return sum(len(r.sampler.stack) for r in self._ranks.values())

    def rate(self) -> float:
        return min((r.sampler.rate for r in self._ranks.values()), default=self._rate)

    def take_window(self, now: float) -> ReuseWindow | None:
        """The window since the last call (None when nothing arrived), and start the next one."""
        self._take_wanted()
        win, self._win = self._win, _Window(start=now)
        held, self._held_back = self._held_back, self._cold()
        if not win.messages and not win.garbage and not win.lost and not win.stale_messages and not win.duplicates:
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
            duplicates=win.duplicates,
            stale_messages=win.stale_messages,
            stale_tokens=win.stale_tokens,
            other_group_blocks=win.other_group_blocks,
            kv_groups=max(1, len(self.groups)),
            first_ts=win.first_ts,
            last_ts=win.last_ts,
            points=[
                [float(c), float(win.points[i] if win.points else 0)]
                for i, c in enumerate(self._capacities)
                if c not in held
            ],
            arc_points=[
                [float(c), float(win.arc_points[i] if win.arc_points else 0)]
                for i, c in enumerate(self._capacities)
                if c not in held
            ]
            if self._arc
            else [],
        )

    def _cold(self) -> set[int]:
        out: set[int] = set()
        for r in self._ranks.values():
            out |= r.bank.cold()
            if r.arc_bank is not None:
                out |= r.arc_bank.cold()
        return out


class _Rank:
    __slots__ = (
        "arc_bank",
        "bank",
        "batches",
        "chains",
        "last_seq",
        "last_ts",
        "links",
        "log",
        "parents",
        "sampler",
        "suspect_seq",
    )

    def __init__(
        self, sampler: ReuseSampler, bank: TierBank, arc_bank: TierBank | None = None, log: AccessLog | None = None
    ) -> None:
        self.sampler = sampler
        self.log = log
        self.bank = bank
        self.arc_bank = arc_bank
        # last block of a chain -> (running max of its distances, batch it was stored in)
        self.chains: OrderedDict[int, tuple[float, int]] = OrderedDict()
        self.parents: dict[int, int] = {}  # block -> its parent block
        self.links: deque[int] = deque()  # the blocks of ``parents`` in insertion order (oldest first)
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
        self.links.clear()
        if self.log is not None:
            self.log.clear()

    def _gpu_prefix(self, parent: int | None) -> list[int]:
        """The request's GPU-hit blocks, last first: ``parent`` and its known ancestors."""
        out: list[int] = []
        if parent is None:
            return out
        seen: set[int] = set()
        get = self.parents.get
        h: int | None = parent
        while h is not None and h not in seen and len(out) < MAX_PREFIX_WALK:
            out.append(h)
            seen.add(h)
            h = get(h)
        return out

    def stored(self, ev: Stored, win: _Window) -> None:
        sampler = self.sampler
        parent = ev.parent
        hashes = ev.hashes
        running = 0.0
        prefix: list[int] = []
        cont = self.chains.pop(parent, None) if parent is not None else None
        if cont is not None and self.batches - cont[1] <= CONTINUE_BATCHES:
            running = cont[0]  # the same request's next chunk (chunked prefill): one lookup chain
        else:
            prefix = self._gpu_prefix(parent)  # a new request: its GPU hits are offered too
        # block -> parent links; the oldest link goes first (a deque of the keys in insertion order)
        parents, links = self.parents, self.links
        prev = parent
        for h in hashes:
            if prev is not None:
                if h not in parents:
                    links.append(h)
                parents[h] = prev
                if len(parents) > MAX_PARENTS:
                    del parents[links.popleft()]
            prev = h
        win.references += len(hashes)
        lookups = sampler.peek_all(hashes)  # distances as they stood when the request arrived
        bank_prefix = prefix if prefix or not (self.bank.tiers or self.log) else self._gpu_prefix(parent)
        if self.log is not None:
            self.log.add(bank_prefix[::-1], hashes)
        if self.bank.tiers:
            self.bank.serve_into(bank_prefix, hashes, win.points_of(len(self.bank.tiers)))
            if self.arc_bank is not None:
                self.arc_bank.serve_into(bank_prefix, hashes, win.arc_points_of(len(self.arc_bank.tiers)))
        if lookups:
            bins = win.bins
            sampled = win.sampled
            cold = win.cold
            for _h, _b, dist, weight in lookups:
                sampled += weight
                if dist is None:
                    running = math.inf
                elif dist > running:
                    running = dist
                if running == math.inf:
                    cold += weight
                else:
                    b = int(running) if running < 64 else bin_lower(running)
                    bins[b] = bins.get(b, 0.0) + weight
            win.sampled = sampled
            win.cold = cold
            # the request's end: vLLM re-ranks its chunks last block first (GPU-hit prefix included)
            sampler.access_buckets(reversed(lookups))
        if prefix:
            sampler.access_all(prefix)  # an unsampled block costs one hash
        if hashes:
            self.chains[hashes[-1]] = (running, self.batches)
            if len(self.chains) > MAX_CHAINS:
                self.chains.popitem(last=False)
