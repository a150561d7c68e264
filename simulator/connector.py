"""The KV connector side of the engine: the CPU tier, the fs tiers, stores, lookups and their counters.

One object per engine when offload is configured (native OffloadingConnector or LMCache). It works
in offload chunks (`chunk_blocks` GPU blocks each); a chunk is keyed by the hash of its last GPU
block, which covers the whole prefix before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from simulator.blocks import BlockHash
from simulator.config import EngineConfig
from simulator.stats import Stats
from simulator.tiers import CpuTier, FsTier

STORE_SIGHTINGS_MAX = 1_000_000  # bound the store_threshold sighting table on long runs


class OffloadConnector:
    def __init__(self, cfg: EngineConfig, stats: Stats, on_cpu_store: Callable[[int], None] | None = None) -> None:
        o = cfg.offload
        assert o is not None
        self.cfg = cfg
        self.offload = o
        self.stats = stats
        self.device = cfg.profile.device
        self.block_size = cfg.block_size
        self.chunk_blocks = o.chunk_tokens // cfg.block_size
        self.cpu = CpuTier(max(cfg.cpu_num_chunks, 1), o.eviction_policy)
        key = f"{cfg.profile.model.name}-{cfg.cache_dtype}-{o.chunk_tokens}".replace("/", "_")
        self.fs = [FsTier(t.root_dir, key, self.chunk_bytes) for t in o.secondary_tiers]
        self.native = o.backend == "native"
        self.tiering = self.native and o.spec_name == "TieringOffloadingSpec"
        self.on_cpu_store = on_cpu_store
        self.store_counts: dict[BlockHash, int] = {}
        self.pinned: set[BlockHash] = set()  # chunks of in-flight loads (vLLM's prepare_load: not evictable)
        self.store_jobs: list[tuple[float, int]] = []  # (end time, chunks pinned by an in-flight store)
        self.tx_bytes = 0.0  # GPU -> CPU bytes (PCIe tx), for the fake nvidia-smi
        self.config_emitted = False  # kv_offload_config_info appears after the first store

    @property
    def chunk_tokens(self) -> int:
        return self.chunk_blocks * self.block_size

    @property
    def chunk_bytes(self) -> int:
        return int(self.chunk_tokens * self.cfg.kv_bytes_per_token)

    def _tier_inc(self, name: str, value: float, tier: str) -> None:
        if self.tiering:
            self.stats.inc(name, value, tier=tier)

    # ---- lookups -----------------------------------------------------------------------------
    def lookup(self, hashes: Sequence[BlockHash], gpu_blocks: int, cap_blocks: int) -> tuple[int, int, float]:
        """Consecutive chunks found in the CPU tier (then fs) after the GPU hit.

        Returns (blocks found beyond the GPU hit, of which from disk, seconds of fs reads)."""
        k = self.chunk_blocks
        j = gpu_blocks // k
        end = gpu_blocks
        disk_blocks = 0
        fs_read_s = 0.0
        chunks_looked = 0
        while (j + 1) * k <= len(hashes) and j * k < cap_blocks:
            h = hashes[(j + 1) * k - 1]
            chunks_looked += 1
            self._tier_inc("vllm:kv_offload_tiering_block_queries", 1, tier="0:primary")
            if h in self.cpu:
                self._tier_inc("vllm:kv_offload_tiering_block_hits", 1, tier="0:primary")
                if self.cpu.policy != "lru":  # vLLM's LRU re-ranks at the request's end (finish())
                    self.cpu.touch(h)
            else:
                found = False
                for i, fs in enumerate(self.fs, start=1):
                    self._tier_inc("vllm:kv_offload_tiering_block_queries", 1, tier=f"{i}:fs")
                    if h in fs and fs.read(h):
                        self._tier_inc("vllm:kv_offload_tiering_block_hits", 1, tier=f"{i}:fs")
                        fs_read_s += self._promote_from_fs(h, i)
                        found = True
                        break
                if not found:
                    break
                disk_blocks += min((j + 1) * k, cap_blocks) - max(j * k, gpu_blocks)
            end = min((j + 1) * k, cap_blocks)
            j += 1
        if self.native:
            self.stats.observe("vllm:kv_offload_lookup_sync_delay_seconds", 8e-06 + 1.5e-06 * chunks_looked)
        return max(0, end - gpu_blocks), disk_blocks, fs_read_s

    def _promote_from_fs(self, h: BlockHash, tier: int) -> float:
        """fs -> CPU staging (every promotion goes through the CPU tier); returns the read seconds."""
        secs = self.chunk_bytes / self.device.disk_bytes_per_s
        self._tier_inc("vllm:kv_offload_tiering_read_bytes", self.chunk_bytes, tier=f"{tier}:fs")
        self._tier_inc("vllm:kv_offload_tiering_read_time", secs, tier=f"{tier}:fs")
        self._cpu_insert(h)
        return secs

    def hung_lookups(self, n: int) -> None:
        """A hung request's lookup, retried `n` more times (hybrid reload on newer builds)."""
        for _ in range(n):
            if self.native:
                self.stats.observe("vllm:kv_offload_lookup_sync_delay_seconds", 9.5e-06)
            self._tier_inc("vllm:kv_offload_tiering_block_queries", 1, tier="0:primary")
            self._tier_inc("vllm:kv_offload_tiering_block_hits", 1, tier="0:primary")

    # ---- stores and loads --------------------------------------------------------------------
    def _cpu_insert(self, h: BlockHash) -> None:
        self.cpu.insert(h)
        if self.on_cpu_store is not None:
            self.on_cpu_store(self.cpu.slot[h])

    def store(
        self, hashes: Sequence[BlockHash], now: float, start_chunk: int = 0, recorded: list[BlockHash] | None = None
    ) -> None:
        """Offer the full chunks of `hashes` from `start_chunk` on (async GPU->CPU copy, fs write-through).

        As vLLM 0.32's OffloadingConnector (tests/agent/kvevents/vllm_tier.py cites it): chunks already in
        the CPU tier are recorded for the request's end-of-request re-rank, new ones are stored
        if the LRU tier can make room outside the offer, else none of them is
        ("cannot store chunks"). ``recorded`` collects the request's chunks for ``finish``."""
        k = self.chunk_blocks
        threshold = self.offload.store_threshold
        new: list[BlockHash] = []
        offer: list[BlockHash] = []
        for j in range(start_chunk, len(hashes) // k):
            h = hashes[(j + 1) * k - 1]
            offer.append(h)
            if h in self.cpu:
                if recorded is not None:
                    recorded.append(h)
                continue
            if threshold >= 2:
                if len(self.store_counts) > STORE_SIGHTINGS_MAX:
                    self.store_counts.clear()
                seen = self.store_counts.get(h, 0) + 1
                self.store_counts[h] = seen
                if seen < threshold:
                    self.stats.inc("vllm:kv_offload_stores_skipped", 1)
                    continue
            new.append(h)
        if not new:
            return
        stored = True
        if self.cpu.policy == "lru":
            if self.cpu.store_lru(new, set(offer) | self.pinned) is None:
                self.stats.inc("vllm:kv_offload_allocation_failure", 1)
                stored = False  # the secondary (fs) tiers are still written through below
            elif self.on_cpu_store is not None:
                for h in new:
                    self.on_cpu_store(self.cpu.slot[h])
        else:
            for h in new:
                self._cpu_insert(h)
        if recorded is not None and stored:
            recorded.extend(new)
        for h in new:
            for i, fs in enumerate(self.fs, start=1):
                wrote = fs.write(h, {"model": self.cfg.profile.model.name, "tokens": self.chunk_tokens})
                if wrote:
                    self._tier_inc("vllm:kv_offload_tiering_write_bytes", wrote, tier=f"{i}:fs")
                    self._tier_inc(
                        "vllm:kv_offload_tiering_write_time", wrote / self.device.disk_bytes_per_s, tier=f"{i}:fs"
                    )
        if not stored:
            return
        nbytes = len(new) * self.chunk_bytes
        secs = nbytes / self.device.pcie_bytes_per_s
        self.tx_bytes += nbytes
        self.store_jobs.append((now + secs, len(new)))
        if self.native:
            self.stats.inc("vllm:kv_offload_store_bytes", nbytes)
            self.stats.inc("vllm:kv_offload_store_time", secs)
            self.stats.observe("vllm:kv_offload_store_size", nbytes)
            self.stats.inc("vllm:kv_offload_total_bytes", nbytes, transfer_type="GPU_to_CPU")
            self.stats.inc("vllm:kv_offload_total_time", secs, transfer_type="GPU_to_CPU")
            self.stats.observe("vllm:kv_offload_size", nbytes, transfer_type="GPU_to_CPU")
            self.stats.observe("vllm:kv_offload_cpu_allocation_size", len(new))
        self.config_emitted = True

    def finish(self, recorded: list[BlockHash], hashes: Sequence[BlockHash]) -> None:
        """The request ended: its recorded chunks re-ranked in prefix order, last block first."""
        if not recorded:
            return
        k = self.chunk_blocks
        position = {hashes[(j + 1) * k - 1]: j for j in range(len(hashes) // k)}
        self.cpu.rerank(sorted(set(recorded), key=lambda h: position.get(h, -1)))

    def record_load(self, load_bytes: int, secs: float) -> None:
        """Connector-load counters (the engine attributes them with the prompt accounting)."""
        if not (self.native and load_bytes):
            return
        self.stats.inc("vllm:kv_offload_load_bytes", load_bytes)
        self.stats.inc("vllm:kv_offload_load_time", secs)
        self.stats.observe("vllm:kv_offload_load_size", load_bytes)
        self.stats.inc("vllm:kv_offload_total_bytes", load_bytes, transfer_type="CPU_to_GPU")
        self.stats.inc("vllm:kv_offload_total_time", secs, transfer_type="CPU_to_GPU")
        self.stats.observe("vllm:kv_offload_size", load_bytes, transfer_type="CPU_to_GPU")

    # ---- gauges and control ------------------------------------------------------------------
    def usage(self, now: float, loading_chunks: int) -> tuple[float, float]:
        """(share of CPU chunks pinned by in-flight stores, by in-flight loads)."""
        self.store_jobs = [(end, n) for end, n in self.store_jobs if end > now]
        cap = self.cpu.capacity
        writing = sum(n for _, n in self.store_jobs)
        return min(1.0, writing / cap), min(1.0, loading_chunks / cap)

    def reset(self) -> None:
        self.cpu.clear()
        for fs in self.fs:
            fs.clear()
        self.store_counts.clear()
