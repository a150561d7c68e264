"""The GPU KV pool: fixed-size blocks shared by running requests and the prefix cache.

Like vLLM v1's BlockPool/KVCacheManager: full blocks are hashed as a chain (each hash covers the
parent hash and the block's token ids), a cached block with no reference sits in the free queue and
is evicted (its hash dropped) only when the head of the free queue is popped for a new allocation.
Freed blocks are appended tail-first, so a prompt's last blocks are evicted before its first ones.
Like vLLM 0.32's BlockHashToBlockMap (its NOTE #1) the cache does not de-duplicate: a block computed
again while another block holds its hash (two requests prefilling one document side by side, or a
full hit's last block, recomputed for its last token) is cached and announced too, and evicting
each copy announces its own removal.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence

BlockHash = bytes
# Told of every prefix-cache change, like vLLM's KV events: ("stored", hash, parent hash or None),
# ("removed", hash, None), ("cleared", None, None). simulator/kv_events.py publishes them.
CacheListener = Callable[[str, BlockHash | None, BlockHash | None], None]


def block_hashes(token_ids: Sequence[int], block_size: int, parent: BlockHash = b"") -> list[BlockHash]:
    """Chained hashes of every FULL block of `token_ids` (a partial last block has none)."""
    out: list[BlockHash] = []
    h = parent
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        chunk = token_ids[start : start + block_size]
        h = hashlib.sha256(h + struct.pack(f"<{len(chunk)}I", *chunk)).digest()[:16]
        out.append(h)
    return out


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[BlockHash, list[int]] = {}  # hash -> the blocks holding it (first one hits)
        self._num_cached = 0
        self.evictions = 0
        self.listener: CacheListener | None = None

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    @property
    def num_cached(self) -> int:
        """Blocks holding a hash (copies of one hash each count)."""
        return self._num_cached

    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: blocks held by requests; cached-but-free blocks count as free."""
        return self.num_used / self.num_blocks

    def longest_hit(self, hashes: Sequence[BlockHash]) -> list[int]:
        """Block ids of the longest cached prefix of `hashes`."""
        hit: list[int] = []
        for h in hashes:
            bids = self.cached.get(h)
            if not bids:
                break
            hit.append(bids[0])
        return hit

    def touch(self, block_ids: Sequence[int]) -> None:
        for bid in block_ids:
            if self.ref_cnt[bid] == 0:
                self.free.pop(bid, None)
            self.ref_cnt[bid] += 1

    def free_after_touch(self, block_ids: Sequence[int]) -> int:
        """How many blocks would stay free if `block_ids` were touched now."""
        return self.num_free - sum(1 for b in set(block_ids) if self.ref_cnt[b] == 0)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise RuntimeError(f"cannot allocate {n} blocks, {len(self.free)} free")
        out: list[int] = []
        for _ in range(n):
            bid, _ = self.free.popitem(last=False)
            h = self.block_hash[bid]
            if h is not None:
                bids = self.cached.get(h)
                if bids is not None and bid in bids:
                    bids.remove(bid)
                    if not bids:
                        del self.cached[h]
                    self._num_cached -= 1
                    self.evictions += 1
                    if self.listener is not None:
                        self.listener("removed", h, None)
                self.block_hash[bid] = None
            self.ref_cnt[bid] = 1
            out.append(bid)
        return out

    def cache(self, bid: int, h: BlockHash, parent: BlockHash | None = None) -> None:
        """Mark a computed full block as cached under `h` and announce it, whether or not another
        block holds `h` already (vLLM's cache_full_blocks); a block cached before stays as it is."""
        if self.block_hash[bid] is None:
            self.block_hash[bid] = h
            self.cached.setdefault(h, []).append(bid)
            self._num_cached += 1
            if self.listener is not None:
                self.listener("stored", h, parent)

    def cache_chain(self, block_ids: Sequence[int], hashes: Sequence[BlockHash]) -> None:
        """Cache a request's blocks in order, each told with its parent (the block before it)."""
        parent: BlockHash | None = None
        for bid, h in zip(block_ids, hashes, strict=False):
            self.cache(bid, h, parent)
            parent = h

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block; blocks reaching zero join the free queue tail-first."""
        for bid in reversed(block_ids):
            self.ref_cnt[bid] -= 1
            if self.ref_cnt[bid] < 0:
                raise RuntimeError(f"block {bid} released twice")
            if self.ref_cnt[bid] == 0:
                self.free[bid] = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Refused (False) while requests hold blocks, like vLLM."""
        if self.num_used:
            return False
        self.cached.clear()
        self._num_cached = 0
        self.block_hash = [None] * self.num_blocks
        if self.listener is not None:
            self.listener("cleared", None, None)
        return True
