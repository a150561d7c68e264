"""The simulated engine: a cost model plus the block cache, driven with an explicit `now`.

Each request goes through phases; each phase is an amount of work done at a rate that depends on
what else is running (piecewise constant between events, so `advance(now)` integrates exactly):

  frontend   base overhead (+ warm-up on the first request)      seconds at rate 1
  waiting    FIFO until its blocks fit in the GPU pool             (no work)
  transfer   KV bytes loaded from the CPU tier                     bytes at PCIe / n_transferring
  load_step  the extra engine step of a connector load (+ fs read) seconds at rate 1
  prefill    tokens not found anywhere                             )  engine steps (continuous batching,
  decode     one token per step                                    )  chunked prefill), see below

Engine steps, like vLLM V1's scheduler: each step every decoding request gets one token, then the
remaining token budget (--max-num-batched-tokens, default 2048) goes to prefilling requests in
admission order (chunked prefill). A step lasts itl * (1 + s * (n_decoding - 1)) if anything decodes,
plus prefill_tokens / prefill_rate. A request joins at the next step boundary; a request's first
token comes at the end of the step that completes its prefill.

TTFT = queueing + recompute + transfer + overheads, as the issue asks; concurrency shares the device.
"""

from __future__ import annotations

import math
import os
import random
from collections import deque
from collections.abc import Callable

from simulator.blocks import BlockHash, BlockPool, block_hashes
from simulator.config import EngineConfig
from simulator.connector import OffloadConnector
from simulator.engine_stats import declare_families, record_finish, record_first_token
from simulator.request import EngineDead, Event, SimRequest
from simulator.stats import Stats
from simulator.tiers import CpuTier
from simulator.tokenizer import encode, filler

HANG_LOOKUP_INTERVAL_S = 0.05  # a hung request's connector lookup is retried every engine step
EPS = 1e-12


class Engine:
    def __init__(
        self,
        cfg: EngineConfig,
        now: float,
        wall_time: float | None = None,
        on_cpu_store: Callable[[int], None] | None = None,
        noise_key: str | None = None,
    ) -> None:
        self.cfg = cfg
        # Seeded noise (cfg.sim_jitter): a factor per server start (key: random per process) x one per step.
        self._noise = random.Random(f"{cfg.seed}-{noise_key if noise_key is not None else os.urandom(8).hex()}")
        self._run_factor = math.exp(self._noise.gauss(0.0, 0.6 * cfg.sim_jitter)) if cfg.sim_jitter > 0 else 1.0
        self.p = cfg.profile
        self.t = now
        self.pool = BlockPool(cfg.num_gpu_blocks)
        self.B = cfg.block_size
        self.stats = Stats(created=wall_time if wall_time is not None else now)
        declare_families(self.stats, cfg)
        self.conn = OffloadConnector(cfg, self.stats, on_cpu_store) if cfg.offload is not None else None
        self.requests: dict[str, SimRequest] = {}
        self.active: list[SimRequest] = []
        self.waiting: deque[SimRequest] = deque()
        self.deferred: list[SimRequest] = []
        self.running = 0  # admitted and not finished
        self.dead = False
        self.stalled_since: float | None = None
        self._hang_lookups_counted = 0
        self.started_any = False
        self.load_jobs: dict[str, int] = {}  # request id -> chunks pinned by its load
        # device telemetry for the fake nvidia-smi
        self.pcie_rx_bytes = 0.0
        self.busy_seconds = 0.0
        self._pending_events: list[Event] = []
        self._admissions = 0
        self.decoding: list[SimRequest] = []
        self.prefilling: list[SimRequest] = []
        self.step_prefill: list[tuple[SimRequest, int]] = []
        self.step_members: list[SimRequest] = []
        self.step_end: float | None = None
        self._blocked: tuple[str, int, int, int] | None = None

    # ---- the connector's state, as the rest of the simulator reads it ---------------------------
    @property
    def cpu(self) -> CpuTier | None:
        return self.conn.cpu if self.conn is not None else None

    @property
    def native(self) -> bool:
        return self.conn is not None and self.conn.native

    @property
    def chunk_tokens(self) -> int:
        return self.conn.chunk_tokens if self.conn is not None else self.B

    @property
    def chunk_bytes(self) -> int:
        return int(self.chunk_tokens * self.cfg.kv_bytes_per_token)

    @property
    def pcie_tx_bytes(self) -> float:
        return self.conn.tx_bytes if self.conn is not None else 0.0

    @property
    def offload_config_emitted(self) -> bool:
        return self.conn is not None and self.conn.config_emitted

    @property
    def on_cpu_store(self) -> Callable[[int], None] | None:
        return self.conn.on_cpu_store if self.conn is not None else None

    @on_cpu_store.setter
    def on_cpu_store(self, cb: Callable[[int], None] | None) -> None:
        if self.conn is not None:
            self.conn.on_cpu_store = cb

    # ---- requests ----------------------------------------------------------------------------
    def submit(self, request_id: str, prompt_ids: list[int], max_tokens: int, now: float, n: int = 1) -> SimRequest:
        if self.dead:
            raise EngineDead("engine is dead")
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) + max_tokens > self.cfg.max_model_len:
            raise ValueError("prompt + max_tokens exceed max_model_len")
        now = max(now, self.t)  # never before the engine's own clock
        # NB: advance() replaces self._pending_events, so take its result first, then extend the new list
        events = self.advance(now)
        self._pending_events.extend(events)
        r = SimRequest(request_id, list(prompt_ids), max_tokens, arrival=now, n=n)
        r.hashes = block_hashes(r.prompt_ids, self.B)
        r.remaining = self.p.base_overhead_s + (0.0 if self.started_any else self.p.warmup_s)
        self.started_any = True
        self.requests[request_id] = r
        self.active.append(r)
        return r

    def abort(self, request_id: str, now: float) -> list[Event]:
        """The client went away: drop the request and free its blocks (counted as finished_reason=abort)."""
        events = self.advance(now)
        r = self.requests.get(request_id)
        if r is None or r.phase in ("done", "failed", "aborted"):
            return events
        if r in self.active:
            self.active.remove(r)
        if r in self.decoding:
            self.decoding.remove(r)
        if r in self.prefilling:
            self.prefilling.remove(r)
        if not self.decoding and not self.prefilling:
            self.step_members, self.step_prefill, self.step_end = [], [], None
        if r in self.waiting:
            self.waiting.remove(r)
        if r in self.deferred:
            self.deferred.remove(r)  # the engine itself stays hung, like the field's builds
        if r.blocks:
            self.pool.release(r.blocks)
            r.blocks = []
            self.running -= 1
        self.load_jobs.pop(r.id, None)
        r.phase = "aborted"
        r.finish_reason = "abort"
        self.stats.inc("vllm:request_success", 1, finished_reason="abort")
        return events

    def forget(self, request_id: str) -> None:
        r = self.requests.get(request_id)
        if r is not None and r.phase in ("done", "failed", "aborted"):
            del self.requests[request_id]

    # ---- time --------------------------------------------------------------------------------
    def _rate(self, r: SimRequest, counts: dict[str, int]) -> float:
        if r.phase in ("frontend", "load_step"):
            return 1.0
        if r.phase == "transfer":
            return self.p.device.pcie_bytes_per_s / counts["transfer"]
        return 0.0

    def _counts(self) -> dict[str, int]:
        c = {"frontend": 0, "transfer": 0, "load_step": 0}
        for r in self.active:
            c[r.phase] += 1
        return c

    def _jitter(self) -> float:  # the noise factor of one step or transfer (1.0 without jitter)
        s = self.cfg.sim_jitter
        return self._run_factor * math.exp(self._noise.gauss(0.0, s)) if s > 0 else 1.0

    def next_event_time(self) -> float | None:
        if self.dead or self.stalled_since is not None:
            return None
        cands: list[float] = []
        if self.active:
            counts = self._counts()
            cands.append(self.t + min(r.remaining / self._rate(r, counts) for r in self.active))
        if self.step_end is not None:
            cands.append(self.step_end)
        return min(cands) if cands else None

    def advance(self, now: float) -> list[Event]:
        events, self._pending_events = self._pending_events, []
        if self.dead or now < self.t:
            return events
        self._schedule(events)
        while (self.active or self.step_end is not None) and self.stalled_since is None and not self.dead:
            counts = self._counts()
            rates = [self._rate(r, counts) for r in self.active]
            dts = [r.remaining / rate for r, rate in zip(self.active, rates, strict=True)]
            dt_step = math.inf if self.step_end is None else max(0.0, self.step_end - self.t)
            dt = min([*dts, dt_step])
            if self.t + dt > now + EPS:
                self._progress(now - self.t, rates, counts)
                self.t = now
                break
            self._progress(dt, rates, counts)
            self.t += dt
            done = [r for r, d in zip(self.active, dts, strict=True) if d <= dt + EPS]
            for r in done:
                r.remaining = 0.0
                self._complete_phase(r, events)
            if self.step_end is not None and dt_step <= dt + EPS:
                self._step_done(events)
            self._schedule(events)
            self._maybe_start_step()
        else:
            self.t = max(self.t, now)
        if self.stalled_since is not None:
            self._count_hang_lookups()
        return events

    def _maybe_start_step(self) -> None:
        if self.step_end is not None or self.dead or self.stalled_since is not None:
            return
        if not self.decoding and not self.prefilling:
            return
        self.step_members = list(self.decoding)
        budget = self.cfg.max_num_batched_tokens - len(self.step_members)
        self.step_prefill = []
        for r in sorted(self.prefilling, key=lambda q: q.admit_seq):
            if budget <= 0:
                break
            take = min(math.ceil(r.remaining), budget)
            self.step_prefill.append((r, take))
            budget -= take
        n = len(self.step_members)
        dur = self.p.itl_s * (1.0 + self.p.itl_batch_slowdown * (n - 1)) if n else 0.0
        dur += sum(t for _, t in self.step_prefill) / self.p.prefill_tokens_per_s
        self.step_end = self.t + dur * self._jitter()

    def _prompt_scheduled(self, r: SimRequest) -> None:
        """``r``'s prompt is scheduled for computing: as vLLM 0.32 does it in that ``Scheduler.schedule()``
        call, its full blocks are cached (and announced) now, not when its prefill ends
        (``KVCacheManager.allocate_slots`` -> ``cache_blocks``), so a request scheduled after it hits them
        on the GPU; and the offload connector offers the tier its chunks in the same call
        (``OffloadingConnectorScheduler.build_connector_meta`` -> ``_build_store_jobs``). A request that
        loads gets here when its load is done: vLLM caches loaded blocks only then
        (``allocate_slots(delay_cache_blocks=True)``, ``Scheduler._update_waiting_for_remote_kv``), so a
        request scheduled while it loads misses them on the GPU and loads the prefix too. vLLM caches
        and offers a prompt longer than the step's token budget step by step; here it is at once."""
        self._cache_prompt_blocks(r)
        if self.conn is not None:
            self.conn.store(r.hashes, self.t, start_chunk=r.next_store_chunk, recorded=r.tier_keys)

    def _step_done(self, events: list[Event]) -> None:
        members, self.step_members, self.step_end = self.step_members, [], None
        chunks, self.step_prefill = self.step_prefill, []
        self.stats.observe("vllm:iteration_tokens_total", len(members) + sum(t for _, t in chunks))
        for m in members:
            if m.phase == "decode":  # not preempted, aborted or failed meanwhile
                self._emit_token(m, events, "token")
        for r, take in chunks:
            if r.phase == "prefill":
                r.remaining = max(0.0, r.remaining - take)
                if r.remaining <= EPS:
                    self._prefill_done(r, events)

    def _progress(self, dt: float, rates: list[float], counts: dict[str, int]) -> None:
        if dt <= 0:
            return
        for r, rate in zip(self.active, rates, strict=True):
            r.remaining = max(0.0, r.remaining - rate * dt)
            if r.phase == "transfer":
                self.pcie_rx_bytes += rate * dt
        if counts["transfer"] or self.step_end is not None:
            self.busy_seconds += dt

    # ---- scheduling --------------------------------------------------------------------------
    def _schedule(self, events: list[Event]) -> None:
        while self.waiting and not self.dead and self.stalled_since is None and self.running < self.cfg.max_num_seqs:
            r = self.waiting[0]
            if self._blocked == (r.id, self.pool.num_free, self.pool.evictions, self.pool.num_cached):
                return  # nothing changed since the head last failed to fit
            resumed = r.first_token_at is not None  # preempted after its first token: recompute mode
            seq_len = r.prompt_len + len(r.token_times)
            hashes = self._seq_hashes(r) if resumed else r.hashes
            cap_blocks = (seq_len - 1) // self.B
            hit_ids = self.pool.longest_hit(hashes[:cap_blocks]) if self.cfg.enable_prefix_caching else []
            need = math.ceil((seq_len + 1) / self.B) - len(hit_ids)  # the sequence + the next token's slot
            if self.pool.free_after_touch(hit_ids) < need:
                self._blocked = (r.id, self.pool.num_free, self.pool.evictions, self.pool.num_cached)
                return
            self._blocked = None
            self.waiting.popleft()
            self.pool.touch(hit_ids)
            r.blocks = hit_ids + self.pool.allocate(need)
            self.running += 1
            self._admissions += 1
            r.admit_seq = self._admissions
            r.scheduled_at = self.t if r.scheduled_at is None else r.scheduled_at
            g_tokens = len(hit_ids) * self.B
            if resumed:  # no new prompt accounting and no connector load for a resumed request
                r.resume_compute = seq_len - g_tokens
                self._start_prefill(r, r.resume_compute)
                continue
            r.gpu_hit_tokens = g_tokens
            r.ext_tokens = r.ext_disk_tokens = 0
            self.stats.inc("vllm:prefix_cache_queries", r.prompt_len)
            self.stats.inc("vllm:prefix_cache_hits", g_tokens)
            if self.conn is not None:
                self.stats.inc("vllm:external_prefix_cache_queries", r.prompt_len - g_tokens)
                ext_blocks, disk_blocks, r.fs_read_s = self.conn.lookup(r.hashes, len(hit_ids), cap_blocks)
                r.ext_tokens = ext_blocks * self.B
                r.ext_disk_tokens = disk_blocks * self.B
                k = self.conn.chunk_tokens
                if r.ext_tokens:  # vLLM's CHUNK_LEVEL: loaded chunks recorded, only what follows offered
                    first, end = g_tokens // k, (g_tokens + r.ext_tokens) // k
                    r.tier_keys = [r.hashes[(j + 1) * self.conn.chunk_blocks - 1] for j in range(first, end)]
                    r.next_store_chunk = end
                else:  # nothing loaded: every chunk is offered from chunk 0, GPU hits included
                    r.tier_keys, r.next_store_chunk = [], 0
            if r.ext_tokens and self.p.model.is_hybrid:
                self._hybrid_reload_failure(r, events)
                return
            r.load_bytes = r.ext_tokens * self.cfg.kv_bytes_per_token
            if r.ext_tokens:
                r.phase, r.remaining = "transfer", float(r.load_bytes) * self._jitter()
                r.load_started = self.t
                self.load_jobs[r.id] = math.ceil(r.ext_tokens / self.chunk_tokens)
                self._pin()
                self.active.append(r)
            else:
                self._start_prefill(r, r.computed_tokens)

    def _pin(self) -> None:
        """The tier's chunks that in-flight loads read: vLLM's ``CPUOffloadingManager.prepare_load`` pins
        them (ref_cnt + 1, ``mark_non_evictable``) until ``complete_load``, so no store evicts them."""
        if self.conn is not None:
            self.conn.pinned = {h for rid in self.load_jobs for h in self.requests[rid].tier_keys}

    def _start_prefill(self, r: SimRequest, tokens: int) -> None:
        if r in self.active:
            self.active.remove(r)
        r.phase, r.remaining = "prefill", float(max(tokens, 1))
        self.prefilling.append(r)
        if r.first_token_at is None:  # not a resumed request's recompute
            self._prompt_scheduled(r)

    def _seq_hashes(self, r: SimRequest) -> list[BlockHash]:
        """Block hashes of the prompt plus the tokens generated so far (memoised while it waits)."""
        n = len(r.token_times)
        if r.seq_hash_cache[0] != n:
            r.seq_hash_cache = (n, block_hashes(r.prompt_ids + r.output_ids[:n], self.B))
        return r.seq_hash_cache[1]

    def _preempt(self, v: SimRequest) -> None:
        """vLLM's recompute preemption: free the victim's blocks (its computed blocks stay cached) and
        put it back at the head of the queue."""
        if v in self.active:
            self.active.remove(v)
        if v in self.decoding:
            self.decoding.remove(v)
        if v in self.prefilling:
            self.prefilling.remove(v)
        if self.cfg.enable_prefix_caching and v.first_token_at is not None:
            self.pool.cache_chain(v.blocks, self._seq_hashes(v))
        self.pool.release(v.blocks)
        v.blocks = []
        self.running -= 1
        self.load_jobs.pop(v.id, None)
        v.preemptions += 1
        self.stats.inc("vllm:num_preemptions", 1)
        v.phase, v.remaining = "waiting", 0.0
        self.waiting.appendleft(v)

    def _grow(self, r: SimRequest) -> bool:
        """Make room for the next decode step; preempts the most recently scheduled requests if the pool
        is full. False when `r` itself had to be preempted."""
        need_tokens = r.prompt_len + len(r.token_times) + 1
        while len(r.blocks) * self.B < need_tokens:
            if self.pool.num_free == 0:
                victim = max(
                    (q for q in (*self.active, *self.prefilling, *self.decoding) if q.blocks and q.phase != "deferred"),
                    key=lambda q: q.admit_seq,
                    default=r,
                )
                self._preempt(victim)
                if victim is r:
                    return False
                continue
            r.blocks += self.pool.allocate(1)
        return True

    def _hybrid_reload_failure(self, r: SimRequest, events: list[Event]) -> None:
        if self.cfg.hybrid_failure == "crash":
            self.dead = True
            msg = (
                "EngineCore encountered a fatal error: restoring the recurrent (mamba) state of a hybrid model "
                "from the KV connector is not supported (mamba_cache_mode=align has no restore path)"
            )
            for q in [*self.active, *self.prefilling, *self.decoding, *self.waiting, *self.deferred, r]:
                q.phase, q.error = "failed", msg
                events.append(Event("failed", q.id, self.t, msg))
            self.active.clear()
            self.prefilling.clear()
            self.decoding.clear()
            self.waiting.clear()
            self.step_members, self.step_prefill, self.step_end = [], [], None
            return
        r.phase = "deferred"
        self.deferred.append(r)
        self.stalled_since = self.t
        self._hang_lookups_counted = 0

    def _count_hang_lookups(self) -> None:
        assert self.stalled_since is not None
        n = int((self.t - self.stalled_since) / HANG_LOOKUP_INTERVAL_S)
        if self.conn is not None and n > self._hang_lookups_counted:
            self.conn.hung_lookups(n - self._hang_lookups_counted)
        self._hang_lookups_counted = max(n, self._hang_lookups_counted)

    # ---- phase transitions -------------------------------------------------------------------
    def _complete_phase(self, r: SimRequest, events: list[Event]) -> None:
        if r.phase == "frontend":
            self.active.remove(r)
            r.phase = "waiting"
            r.enqueued_at = self.t
            self.waiting.append(r)
        elif r.phase == "transfer":
            r.phase, r.remaining = "load_step", (self.p.device.load_step_s + r.fs_read_s) * self._jitter()
            r.load_secs = self.t - r.load_started
            self.load_jobs.pop(r.id, None)
            self._pin()
        elif r.phase == "load_step":
            self._start_prefill(r, r.computed_tokens)

    def _prefill_done(self, r: SimRequest, events: list[Event]) -> None:
        self.prefilling.remove(r)
        if r.first_token_at is not None:  # a resumed request finished its recompute
            self._emit_token(r, events, "token")
            return
        r.first_token_at = self.t
        self._cache_prompt_blocks(r)  # cached when its prompt was scheduled: nothing left to announce
        if self.conn is not None:
            self.conn.record_load(r.load_bytes, r.load_secs)
        record_first_token(self.stats, self.cfg, r)
        self._emit_token(r, events, "first_token")

    def _emit_token(self, r: SimRequest, events: list[Event], kind: str) -> None:
        if not r.output:
            r.output = filler(r.max_tokens, self.cfg.seed, r.prompt_ids)
            r.output_ids = encode("".join(r.output))
        r.token_times.append(self.t)
        self.stats.inc("vllm:generation_tokens", 1)
        events.append(Event(kind, r.id, self.t))
        if len(r.token_times) >= r.max_tokens:
            self._finish(r, events)
            return
        if r.phase != "decode":  # joins the decode batch at the next step
            if r in self.active:
                self.active.remove(r)
            r.phase, r.remaining = "decode", 0.0
            self.decoding.append(r)
        self._grow(r)

    def _finish(self, r: SimRequest, events: list[Event]) -> None:
        r.finished_at = self.t
        r.finish_reason = "length"
        if r in self.active:
            self.active.remove(r)
        if r in self.decoding:
            self.decoding.remove(r)
        r.phase = "done"
        all_hashes = block_hashes(r.prompt_ids + r.output_ids, self.B)
        if self.cfg.enable_prefix_caching:
            self.pool.cache_chain(r.blocks, all_hashes)
        if self.conn is not None:
            if not self.conn.offload.offload_prompt_only:
                start = len(r.hashes) // self.conn.chunk_blocks
                self.conn.store(all_hashes, self.t, start_chunk=start, recorded=r.tier_keys)
            self.conn.finish(r.tier_keys, all_hashes)
        self.pool.release(r.blocks)
        self.running -= 1
        record_finish(self.stats, self.cfg, r)
        events.append(Event("finished", r.id, self.t))

    def _cache_prompt_blocks(self, r: SimRequest) -> None:
        if self.cfg.enable_prefix_caching:
            self.pool.cache_chain(r.blocks, r.hashes)

    # ---- gauges and control ------------------------------------------------------------------
    def gauges(self) -> dict[str, float]:
        write, read = self.conn.usage(self.t, sum(self.load_jobs.values())) if self.conn is not None else (0.0, 0.0)
        return {
            "running": float(self.running - len(self.deferred)),
            "waiting_capacity": float(len(self.waiting)),
            "waiting_deferred": float(len(self.deferred)),
            "kv_cache_usage": self.pool.usage(),
            "cpu_write_usage": write,
            "cpu_read_usage": read,
            "cpu_usage": min(1.0, write + read),
        }

    def reset_prefix_cache(self, reset_external: bool) -> bool:
        if not self.pool.reset_prefix_cache():
            return False
        if reset_external and self.conn is not None:
            self.conn.reset()
        return True

    def pool_bytes_in_use(self) -> int:
        """Bytes of the GPU pool holding KV (running + cached): what a memory heat-map would show."""
        blocks = self.pool.num_used + sum(
            1 for b in range(self.pool.num_blocks) if self.pool.ref_cnt[b] == 0 and self.pool.block_hash[b] is not None
        )
        return int(blocks * self.B * self.cfg.bytes_per_token)


__all__ = ["Engine", "EngineDead", "Event", "SimRequest"]
