"""Offload tiers: the CPU tier (capacity in chunks, LRU or ARC) and the fs secondary tier.

The CPU tier maps each resident chunk to a slot of the pinned buffer (slot i = bytes
[i*chunk_bytes, (i+1)*chunk_bytes) of /dev/shm/vllm_offload_<id>.mmap). The fs tier really writes
one file per chunk under root_dir (sparse, of the chunk's size, with a small header) and finds the
files again after a restart.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path

from simulator.blocks import BlockHash


class CpuTier:
    def __init__(self, capacity: int, policy: str = "lru") -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        if policy not in ("lru", "arc"):
            raise ValueError(f"unknown eviction policy {policy!r}")
        self.capacity = capacity
        self.policy = policy
        # LRU uses t1 only. ARC: t1 (seen once), t2 (seen twice+), b1/b2 ghosts, target p.
        self.t1: OrderedDict[BlockHash, None] = OrderedDict()
        self.t2: OrderedDict[BlockHash, None] = OrderedDict()
        self.b1: OrderedDict[BlockHash, None] = OrderedDict()
        self.b2: OrderedDict[BlockHash, None] = OrderedDict()
        self.p = 0.0
        self.slot: dict[BlockHash, int] = {}
        self._free_slots = list(range(capacity - 1, -1, -1))
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def __contains__(self, h: object) -> bool:
        return h in self.t1 or h in self.t2

    def touch(self, h: BlockHash) -> None:
        """A lookup hit: refresh recency (ARC: promote to t2)."""
        if self.policy == "lru":
            self.t1.move_to_end(h)
            return
        if h in self.t1:
            del self.t1[h]
            self.t2[h] = None
        elif h in self.t2:
            self.t2.move_to_end(h)

    def store_lru(self, keys: list[BlockHash], protected: set[BlockHash]) -> list[BlockHash] | None:
        """vLLM 0.32's ``CPUOffloadingManager.prepare_store`` with the LRU policy: make room from the
        least recent chunks *outside the offer* (``protected``), or store nothing (None) when too few
        are evictable; then insert the chunks in offer order. Returns the evicted chunks."""
        need = len(self.t1) + len(keys) - self.capacity
        victims: list[BlockHash] = []
        if need > 0:
            for k in self.t1:
                if k not in protected:
                    victims.append(k)
                    if len(victims) == need:
                        break
            if len(victims) < need:
                return None
            for k in victims:
                del self.t1[k]
                self._free_slots.append(self.slot.pop(k))
        for k in keys:
            self.t1[k] = None
            self.slot[k] = self._free_slots.pop()
        self.evictions += len(victims)
        return victims

    def rerank(self, keys: list[BlockHash]) -> None:
        """``LRUCachePolicy.on_request_finished``: a request's chunks (prefix order) re-ranked last
        block first, so its first chunk ends the most recent. ARC keeps its own hit promotion."""
        if self.policy != "lru":
            return
        for k in reversed(keys):
            if k in self.t1:
                self.t1.move_to_end(k)

    def insert(self, h: BlockHash) -> list[BlockHash]:
        """Store a chunk; returns the chunks evicted to make room (their slots are reused)."""
        if h in self:
            self.touch(h)
            return []
        evicted = self._insert_lru(h) if self.policy == "lru" else self._insert_arc(h)
        for e in evicted:
            self._free_slots.append(self.slot.pop(e))
        self.slot[h] = self._free_slots.pop()
        self.evictions += len(evicted)
        return evicted

    def _insert_lru(self, h: BlockHash) -> list[BlockHash]:
        evicted: list[BlockHash] = []
        while len(self.t1) >= self.capacity:
            e, _ = self.t1.popitem(last=False)
            evicted.append(e)
        self.t1[h] = None
        return evicted

    def _replace(self, in_b2: bool) -> BlockHash:
        from_t1 = (in_b2 and len(self.t1) == self.p) or len(self.t1) > self.p
        if self.t1 and (from_t1 or not self.t2):
            e, _ = self.t1.popitem(last=False)
            self.b1[e] = None
        else:
            e, _ = self.t2.popitem(last=False)
            self.b2[e] = None
        return e

    def _insert_arc(self, h: BlockHash) -> list[BlockHash]:
        c = self.capacity
        evicted: list[BlockHash] = []
        if h in self.b1:
            self.p = min(float(c), self.p + max(len(self.b2) / len(self.b1), 1.0))
            if len(self) >= c:
                evicted.append(self._replace(False))
            del self.b1[h]
            self.t2[h] = None
            return evicted
        if h in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            if len(self) >= c:
                evicted.append(self._replace(True))
            del self.b2[h]
            self.t2[h] = None
            return evicted
        if len(self.t1) + len(self.b1) >= c:
            if len(self.t1) < c:
                self.b1.popitem(last=False)
                if len(self) >= c:
                    evicted.append(self._replace(False))
            else:
                e, _ = self.t1.popitem(last=False)
                evicted.append(e)
        else:
            total = len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2)
            if total >= c:
                if total >= 2 * c and self.b2:
                    self.b2.popitem(last=False)
                if len(self) >= c:
                    evicted.append(self._replace(False))
        self.t1[h] = None
        return evicted

    def clear(self) -> None:
        for d in (self.t1, self.t2, self.b1, self.b2):
            d.clear()
        self.slot.clear()
        self._free_slots = list(range(self.capacity - 1, -1, -1))
        self.p = 0.0


class FsTier:
    """A directory of chunk files: `<root_dir>/kvscope-sim-<config_key>/<hh>/<hash>.kv`."""

    def __init__(self, root_dir: str | Path, config_key: str, chunk_bytes: int) -> None:
        self.base = Path(root_dir) / f"kvscope-sim-{config_key}"
        self.base.mkdir(parents=True, exist_ok=True)
        self.chunk_bytes = chunk_bytes
        self.index: set[BlockHash] = set()
        for f in self.base.glob("*/*.kv"):
            try:
                self.index.add(bytes.fromhex(f.stem))
            except ValueError:
                continue

    def path(self, h: BlockHash) -> Path:
        hx = h.hex()
        return self.base / hx[:2] / f"{hx}.kv"

    def __contains__(self, h: object) -> bool:
        return h in self.index

    def __len__(self) -> int:
        return len(self.index)

    def write(self, h: BlockHash, meta: dict[str, object]) -> int:
        """Write the chunk's file (sparse, chunk_bytes long); returns the bytes written logically."""
        if h in self.index:
            return 0
        p = self.path(h)
        p.parent.mkdir(exist_ok=True)
        tmp = p.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(b"KVSCOPE-SIM-KV-CHUNK\n" + json.dumps(meta, sort_keys=True).encode() + b"\n")
            f.truncate(self.chunk_bytes)
        os.replace(tmp, p)
        self.index.add(h)
        return self.chunk_bytes

    def read(self, h: BlockHash) -> bool:
        """Read back a chunk's header; False (and forgotten) when the file vanished or is foreign."""
        try:
            with open(self.path(h), "rb") as f:
                ok = f.read(21) == b"KVSCOPE-SIM-KV-CHUNK\n"
        except OSError:
            ok = False
        if not ok:
            self.index.discard(h)
        return ok

    def clear(self) -> None:
        for h in list(self.index):
            try:
                self.path(h).unlink()
            except OSError:
                pass
        self.index.clear()
