"""The GPU block pool (prefix cache + LRU of free blocks) and the offload tiers (LRU/ARC, fs files)."""

from __future__ import annotations

from pathlib import Path

from simulator.blocks import BlockPool, block_hashes
from simulator.tiers import CpuTier, FsTier


def test_hash_chain_covers_the_prefix() -> None:
    a = block_hashes(list(range(40)), 16)
    assert len(a) == 2  # the partial last block has no hash
    b = block_hashes([*range(16), 99, *range(17, 40)], 16)
    assert a[0] == b[0] and a[1] != b[1]
    c = block_hashes([*range(16, 32), *range(16)], 16)
    assert c[1] != a[0]  # same tokens at another position: different hash (the parent is in it)


def test_free_cached_blocks_are_evicted_oldest_first_tail_first() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    hs = block_hashes(list(range(48)), 16)
    for bid, h in zip(blocks, hs, strict=True):
        pool.cache(bid, h)
    pool.release(blocks)
    assert pool.usage() == 0.0 and pool.num_cached == 3  # cached-but-free counts as free
    assert pool.longest_hit(hs) == blocks
    pool.allocate(2)  # the never-used block first, then the prompt's LAST block
    assert pool.longest_hit(hs) == blocks[:2]
    assert pool.evictions == 1


def test_touch_pins_hit_blocks_and_reset_is_refused_while_in_use() -> None:
    pool = BlockPool(2)
    [b] = pool.allocate(1)
    pool.cache(b, b"h" * 16)
    assert not pool.reset_prefix_cache()
    pool.release([b])
    pool.touch([b])
    assert pool.num_free == 1 and pool.free_after_touch([b]) == 1
    pool.release([b])
    assert pool.reset_prefix_cache() and pool.num_cached == 0


def test_cpu_lru_evicts_least_recently_used() -> None:
    t = CpuTier(2, "lru")
    t.insert(b"a")
    t.insert(b"b")
    t.touch(b"a")
    assert t.insert(b"c") == [b"b"]
    assert b"a" in t and b"c" in t and len(t) == 2
    assert sorted(t.slot.values()) == [0, 1]


def test_cpu_arc_keeps_reused_chunks_through_a_scan() -> None:
    arc, lru = CpuTier(4, "arc"), CpuTier(4, "lru")
    for t in (arc, lru):
        for h in (b"hot1", b"hot2"):
            t.insert(h)
            t.touch(h)  # reused: ARC promotes to its frequency list
        for i in range(6):  # a scan of one-off chunks
            t.insert(b"scan%d" % i)
    assert b"hot1" in arc and b"hot2" in arc
    assert b"hot1" not in lru and b"hot2" not in lru
    assert len(arc) == 4 and len(set(arc.slot.values())) == 4


def test_fs_tier_writes_real_files_and_finds_them_after_restart(tmp_path: Path) -> None:
    fs = FsTier(tmp_path, "model-auto-16", chunk_bytes=1 << 20)
    assert fs.write(b"\x01" * 16, {"tokens": 16}) == 1 << 20
    p = fs.path(b"\x01" * 16)
    assert p.is_file() and p.stat().st_size == 1 << 20 and p.read_bytes().startswith(b"KVSCOPE-SIM-KV-CHUNK")
    again = FsTier(tmp_path, "model-auto-16", chunk_bytes=1 << 20)
    assert b"\x01" * 16 in again and again.read(b"\x01" * 16)
    p.unlink()
    assert not again.read(b"\x01" * 16) and b"\x01" * 16 not in again
    assert b"\x01" * 16 not in FsTier(tmp_path, "other-model", chunk_bytes=1 << 20)


def test_a_block_computed_again_while_its_hash_is_cached_is_announced_and_removed_like_vllm() -> None:
    """vLLM 0.32 does not de-duplicate (BlockHashToBlockMap, NOTE #1): cache_full_blocks inserts
    every newly full block and publishes it as BlockStored, even when another block holds the
    same hash; evicting each copy publishes its own BlockRemoved."""
    pool = BlockPool(4)
    seen: list[tuple[str, bytes | None]] = []
    pool.listener = lambda kind, h, parent: seen.append((kind, h))
    h = block_hashes(list(range(16)), 16)[0]
    a, b = pool.allocate(2)  # two requests computed the same block side by side
    pool.cache(a, h)
    pool.cache(b, h)
    assert seen == [("stored", h), ("stored", h)]
    assert pool.num_cached == 2
    pool.cache(b, h)  # the same block cached again (the request's end) announces nothing
    assert len(seen) == 2
    pool.release([a])
    pool.release([b])
    pool.allocate(2)  # the two never-used blocks
    pool.allocate(1)  # evicts copy a: b still holds the hash
    assert seen[-1] == ("removed", h) and pool.longest_hit([h]) == [b]
    pool.allocate(1)  # evicts copy b
    assert seen[-1] == ("removed", h) and pool.longest_hit([h]) == [] and pool.num_cached == 0
    assert pool.evictions == 2
