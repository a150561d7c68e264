"""From stored reuse-distance windows to "what would a tier of S GiB have reloaded?" (pure).

- Windows add: counts and bins are summed over the range.
- SHARDS-adj (Waldspurger et al., FAST'15): the lookups the sample missed or over-counted
  (``references - reannounced - sampled``) go to distance 0, so totals are exact; at rate 1
  this is 0 and the curve is Mattson's exact one (to the histogram's bin width above 64 blocks).
- A tier of C blocks reloads what vLLM's LRU tier of C chunks loaded in the agent's miniature
  simulation (``points``: exact at those sizes, linear between them); beyond the largest
  simulated size, the lookups whose (chain) distance is < C. Tokens = blocks x block size; bytes
  = tokens x the tier's bytes per token, whose source is always stated. A hybrid model's chunk
  takes one slot per KV-cache group, so C blocks of bytes hold C / groups chunks.
- Reconciliation: the tokens the counted batches announced against vLLM's own computed-token
  counter over the same span; more than 1 % apart and the answer says so (``reconcile``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.kvevents.reuse import bin_upper, hits_at
from app.storage.sizing_store import SizingWindowRow

GIB = float(1 << 30)
CURVE_POINTS = 25
DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4}


@dataclass
class Totals:
    windows: int = 0
    references: float = 0.0
    sampled: float = 0.0
    cold: float = 0.0
    reannounced: float = 0.0
    stored_tokens: float = 0.0
    messages: int = 0
    events: int = 0
    lost: int = 0
    garbage: int = 0
    epochs: int = 0
    tier_stored: int = 0
    tier_removed: int = 0
    rate: float = 1.0
    block_size: int | None = None
    bins: dict[int, float] = field(default_factory=dict)
    points: dict[int, float] = field(default_factory=dict)  # tier chunks -> chunks loaded (simulated)
    point_windows: dict[int, int] = field(default_factory=dict)  # size -> windows that carried it
    arc_points: dict[int, float] = field(default_factory=dict)  # the same for vLLM's ARC policy
    arc_point_windows: dict[int, int] = field(default_factory=dict)
    policy: str = "lru"  # the tier's eviction policy (kv_offload_config_info), set by the caller
    duplicates: int = 0
    stale_messages: int = 0
    stale_tokens: float = 0.0
    other_group_blocks: float = 0.0
    kv_groups: int = 1
    first_ts: float | None = None
    last_ts: float | None = None

    @property
    def lookups(self) -> float:
        """Blocks the GPU computed or reloaded (lookups a tier would have seen)."""
        return max(0.0, self.references - self.reannounced)

    def adjusted(self) -> dict[int, float]:
        bins = dict(self.bins)
        adj = self.lookups - self.sampled
        if adj:
            bins[0] = bins.get(0, 0.0) + adj
        return bins

    def stack_hits(self, chunks: float) -> float:
        """The one-pass LRU (Mattson) estimate for a tier of this many chunks."""
        if chunks <= 0:
            return 0.0
        reusable = max(0.0, self.lookups - self.cold)
        return min(reusable, max(0.0, hits_at(self.adjusted(), chunks)))

    def simulated(self) -> list[tuple[int, float]]:
        """The miniature simulation's points of the tier's policy, at the sizes every window carried."""
        pts, wins = (
            (self.arc_points, self.arc_point_windows) if self.policy == "arc" else (self.points, self.point_windows)
        )
        return sorted((c, n) for c, n in pts.items() if wins.get(c) == self.windows)

    def hits(self, capacity_blocks: float) -> float:
        """Blocks vLLM's LRU tier of this many blocks of bytes would have reloaded."""
        chunks = capacity_blocks / max(1, self.kv_groups)
        if chunks <= 0:
            return 0.0
        pts = self.simulated()
        if pts and chunks <= pts[-1][0]:
            lo_c, lo_h = 0.0, 0.0
            for c, h in pts:
                if chunks <= c:
                    return lo_h + (h - lo_h) * (chunks - lo_c) / (c - lo_c)
                lo_c, lo_h = float(c), h
        above = self.stack_hits(chunks)
        return max(above, pts[-1][1]) if pts else above

    def method(self) -> str:
        pts = self.simulated()
        if self.policy == "arc" and not pts:
            return (
                "the tier runs eviction_policy arc, and no ARC simulation came with these windows (the agent's "
                "--kv-events arc): the figures are LRU's, which a one-pass curve cannot turn into ARC's"
            )
        if pts:
            return (
                f"vLLM's {self.policy.upper()} offload tier simulated at {len(pts)} sizes up to {pts[-1][0]:,} "
                "chunks (miniature simulation of the OffloadingConnector's lookup, store and re-rank order), "
                "linear between them; above, LRU reuse distances of the same stream (Mattson), SHARDS-sampled "
                "(docs/cache-sizing.md)"
            )
        return (
            "LRU reuse distances of the GPU's BlockStored stream in vLLM's re-rank order (Mattson), "
            "SHARDS-sampled; a block counts only if its whole prefix would reload (docs/cache-sizing.md)"
        )

    def reach_blocks(self) -> float:
        """The smallest tier that holds every reuse seen: the first simulated size that reloads
        what an unbounded tier would, else the top of the last non-empty distance bin."""
        full = self.stack_hits(math.inf)
        for c, h in self.simulated():
            if h >= full - 1e-9:
                return float(c * max(1, self.kv_groups))
        tops = [bin_upper(lo) for lo, w in self.bins.items() if w > 0]
        return float(max(tops)) * max(1, self.kv_groups) if tops else 0.0


def _num(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def add_windows(rows: Sequence[SizingWindowRow]) -> Totals:
    t = Totals()
    rates = []
    for row in rows:
        counts = row.get("counts") or {}
        if not isinstance(counts, dict):
            continue
        t.windows += 1
        for name in ("references", "sampled", "cold", "reannounced", "stored_tokens"):
            setattr(t, name, getattr(t, name) + (_num(counts.get(name)) or 0.0))
        for name in ("stale_tokens", "other_group_blocks"):
            setattr(t, name, getattr(t, name) + (_num(counts.get(name)) or 0.0))
        for name in (
            "messages",
            "events",
            "lost",
            "garbage",
            "epochs",
            "tier_stored",
            "tier_removed",
            "duplicates",
            "stale_messages",
        ):
            setattr(t, name, getattr(t, name) + int(_num(counts.get(name)) or 0))
        groups = _num(counts.get("kv_groups"))
        if groups and 1 <= groups <= 1024:
            t.kv_groups = max(t.kv_groups, int(groups))
        for name, pick in (("first_ts", min), ("last_ts", max)):
            ts = _num(counts.get(name))
            if ts is not None:
                cur = getattr(t, name)
                setattr(t, name, ts if cur is None else pick(cur, ts))
        for name, into, wins in (
            ("points", t.points, t.point_windows),
            ("arc_points", t.arc_points, t.arc_point_windows),
        ):
            pts = counts.get(name)
            if not isinstance(pts, list):
                continue
            for pair in pts:
                if isinstance(pair, list | tuple) and len(pair) == 2:
                    c, n = _num(pair[0]), _num(pair[1])
                    if c is not None and n is not None and c > 0:
                        into[int(c)] = into.get(int(c), 0.0) + n
                        wins[int(c)] = wins.get(int(c), 0) + 1
        rate = _num(row.get("rate"))
        if rate:
            rates.append(rate)
        bs = row.get("block_size")
        if isinstance(bs, int) and bs > 0:
            t.block_size = bs
        for pair in row.get("bins") or []:
            if isinstance(pair, list | tuple) and len(pair) == 2:
                lo, w = _num(pair[0]), _num(pair[1])
                if lo is not None and w is not None and lo >= 0:
                    t.bins[int(lo)] = t.bins.get(int(lo), 0.0) + w
    t.rate = min(rates) if rates else 1.0
    return t


@dataclass(frozen=True)
class Figure:
    """A number and where it came from (shown next to it)."""

    value: float | None
    source: str


def _label(cfg: Any, name: str) -> float | None:
    if not isinstance(cfg, dict):
        return None
    raw = cfg.get(name)
    if raw in (None, "None", ""):
        return None
    return _num(raw)


def model_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: str) -> Figure:
    b = DTYPE_BYTES.get(dtype.lower())
    if b is None:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPE_BYTES)}")
    value = float(layers * kv_heads * head_dim * 2 * b)
    return Figure(
        value,
        f"model config given: {layers} layers x {kv_heads} KV heads x {head_dim} head dim x 2 (K and V) "
        f"x {b} byte(s) ({dtype})",
    )


def bytes_per_token(cache_config: Any, offload_config: Any) -> Figure:
    """The tier's bytes per token from what vLLM reports, in order of directness."""
    chunk_bytes = _label(offload_config, "cpu_kv_bytes_per_chunk")
    chunk_tokens = _label(offload_config, "offload_block_size")
    if chunk_bytes and chunk_tokens:
        return Figure(
            chunk_bytes / chunk_tokens,
            "vllm:kv_offload_config_info: cpu_kv_bytes_per_chunk / offload_block_size (the tier's own layout)",
        )
    mem = _label(cache_config, "kv_cache_memory_bytes")
    tokens = _label(cache_config, "kv_cache_size_tokens")
    override = _label(cache_config, "num_gpu_blocks_override")
    if mem and tokens and override is None:
        return Figure(
            mem / tokens,
            "vllm:cache_config_info: kv_cache_memory_bytes / kv_cache_size_tokens "
            "(layers x KV heads x head dim x 2 x dtype bytes, as vLLM laid out the GPU pool)",
        )
    why = (
        "num_gpu_blocks_override is set, so kv_cache_memory_bytes is not what the blocks use"
        if override is not None
        else "vLLM reported neither kv_offload_config_info nor kv_cache_memory_bytes/kv_cache_size_tokens"
    )
    return Figure(None, f"unknown ({why}): give layers, kv_heads, head_dim and dtype")


def current_tier(cache_config: Any, offload_config: Any) -> Figure:
    cpu = _label(offload_config, "cpu_bytes_to_use")
    if cpu:
        return Figure(cpu / GIB, "vllm:kv_offload_config_info: cpu_bytes_to_use")
    size = _label(cache_config, "kv_offloading_size")
    if size:
        return Figure(size, "vllm:cache_config_info: kv_offloading_size (GiB)")
    return Figure(None, "no CPU offload tier configured (kv_offloading_size None)")


def curve(
    t: Totals, bpt: Figure, current: Figure, *, points: int = CURVE_POINTS, max_gib: float | None = None
) -> dict[str, Any]:
    """The sizing answer: points of the curve, the unbounded tier, the knee, the current size."""
    block = t.block_size or 0
    bytes_per_block = (bpt.value or 0.0) * block
    full = t.hits(math.inf)
    reach = t.reach_blocks()
    out: dict[str, Any] = {
        "block_size": t.block_size,
        "bytes_per_token": {"value": bpt.value, "source": bpt.source},
        "lookup_tokens": t.lookups * block,
        "first_seen_tokens": t.cold * block,
        "unbounded_reload_tokens": full * block,
        "current_offload_gib": {"value": current.value, "source": current.source},
        "current_reload_tokens": None,  # what the curve predicts the current tier reloads
        "sizes": [],
        "recommendation": None,
    }
    if not block or t.lookups <= 0:
        out["recommendation"] = {"offload_gib": None, "why": "no KV events in this range yet"}
        return out
    top_blocks = max(reach * 1.1, 16.0)
    if bytes_per_block:
        top_gib = top_blocks * bytes_per_block / GIB
        if current.value:
            top_gib = max(top_gib, current.value * 1.5)
        if max_gib:
            top_gib = min(top_gib, max_gib)
        top_blocks = top_gib * GIB / bytes_per_block
    sizes = []
    for i in range(points):
        blocks = top_blocks * i / (points - 1)
        hits = t.hits(blocks)
        sizes.append(
            {
                "blocks": round(blocks, 3),
                "offload_gib": blocks * bytes_per_block / GIB if bytes_per_block else None,
                "reload_tokens": hits * block,
                "reload_share": hits / t.lookups,
            }
        )
    out["sizes"] = sizes
    out["recommendation"] = _knee(t, full, bytes_per_block)
    if current.value and bytes_per_block:
        out["current_reload_tokens"] = t.hits(current.value * GIB / bytes_per_block) * block
    return out


def _knee(t: Totals, full: float, bytes_per_block: float) -> dict[str, Any]:
    block = t.block_size or 0
    if full <= 0:
        return {
            "offload_gib": 0.0,
            "blocks": 0,
            "why": "no block the GPU dropped was needed again in this range: a tier would only cost "
            "pinned RAM and PCIe bandwidth",
        }
    lo, hi = 0.0, max(1.0, t.reach_blocks())
    while hi - lo > 0.5:  # smallest size reloading 90% of what an unbounded tier would
        mid = (lo + hi) / 2
        if t.hits(mid) >= 0.9 * full:
            hi = mid
        else:
            lo = mid
    blocks = math.ceil(hi)
    gib = blocks * bytes_per_block / GIB if bytes_per_block else None
    size = f"{gib:.2f} GiB ({blocks} blocks)" if gib is not None else f"{blocks} blocks"
    return {
        "offload_gib": gib,
        "blocks": blocks,
        "why": f"{size} reloads {t.hits(blocks) * block:,.0f} of the {full * block:,.0f} prompt tokens an "
        "unbounded tier would have reloaded (90%); beyond it each GiB adds less",
    }


RECONCILE_TOLERANCE = 0.01


def reconcile(
    t: Totals, by_source: dict[str, float], requests: float | None, generated: float | None
) -> dict[str, Any]:
    """The counted batches' announced tokens against vLLM's own counters over the same range.

    Every GPU block vLLM stores was computed or reloaded, so the announced tokens lie between
    ``local_compute + external_kv_transfer`` less the partial last block of each request (never
    announced; at most block size - 1 tokens each) and that plus the generated tokens (full
    decode blocks are announced too). Every announced block counts, a block computed again while
    another copy of it sits on the GPU too (two requests prefilling one document side by side, a
    full hit's last block recomputed for its last token): vLLM 0.32's ``cache_full_blocks`` does
    not de-duplicate and announces both, and vLLM computed both, though the curve's lookups skip
    the second (``reannounced``). Recomputes after a preemption are announced but not counted
    (``PrefillStats`` is set on the first scheduling only): they can only read as "more".
    Outside that band by more than 1 %: a backlog counted as now, lost messages, or a stream that
    is not this instance's; the curve is then not trusted."""
    block = t.block_size or 0
    announced = t.stored_tokens if t.stored_tokens else t.references * block
    computed = by_source.get("local_compute")
    out: dict[str, Any] = {
        "announced_tokens": announced,
        "local_compute_tokens": computed,
        "external_tokens": by_source.get("external_kv_transfer", 0.0),
        "stale_messages_left_out": t.stale_messages,
        "stale_tokens_left_out": t.stale_tokens,
        "duplicates_skipped": t.duplicates,
        "source": "token_ids of the counted GPU BlockStored events vs vllm:prompt_tokens_by_source_total "
        "{local_compute, external_kv_transfer} over the same range",
    }
    if computed is None or not block:
        out.update(status="unknown", why="vLLM's prompt_tokens_by_source counter has not appeared in this range")
        return out
    stored = computed + by_source.get("external_kv_transfer", 0.0)
    partial = (requests or 0.0) * (block - 1)
    low, high = max(0.0, stored - partial), stored + (generated or 0.0)
    out.update(expected_low=low, expected_high=high)
    if low * (1 - RECONCILE_TOLERANCE) <= announced <= high * (1 + RECONCILE_TOLERANCE) or (announced == stored == 0):
        out.update(status="ok", why="the events account for vLLM's computed tokens")
    else:
        side = "more" if announced > high else "fewer"
        gap = announced - high if announced > high else low - announced
        out.update(
            status="mismatch",
            why=f"the events announced {gap:,.0f} {side} tokens than vLLM computed over the range "
            f"({announced:,.0f} vs {low:,.0f}-{high:,.0f}); the curve is not trusted until they agree",
        )
    return out
