"""Every KV lever from the one stream of GPU stores (pure): the CPU tier's price-and-headroom
suggestion, a larger GPU pool (fp8 KV, --kv-cache-memory-bytes, --gpu-memory-utilization) and a
disk tier behind the CPU tier.

The CPU and disk tiers read the LRU curve of the GPU's stores (``Totals.hits``: what a tier would
be asked); a larger GPU pool reads the eviction distances of the same stream (a pool larger by D
blocks keeps the D blocks evicted most recently, agent/kvevents/pool_model.py). Each answer says
whether it is exact or an estimate, and why.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

GIB = float(1 << 30)
# The price of pinned RAM: a GiB must save at least this share of the range's computed prompt
# tokens, or the tier stops growing (the knee of the curve at that price).
DEFAULT_PRICE = 0.01
MIN_PRICE, MAX_PRICE = 0.0, 1.0
POOL_FACTORS = (1.25, 1.5, 2.0)
DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4}
FP8_OUTPUTS = (
    "fp8 KV changes what the model attends to: outputs can change (the field measured a quality "
    "score of 1.900 -> 1.880 on a 50-question set); check quality before keeping it"
)

Hits = Callable[[float], float]  # blocks of a tier -> blocks it would have reloaded


@dataclass(frozen=True)
class Hull:
    """The upper concave hull of (GiB, tokens saved) from 0: slopes only fall, so taking its
    segments steepest first is the best use of every GiB (the greedy split is optimal on it)."""

    points: tuple[tuple[float, float], ...]  # (gib, tokens), starting at (0, 0)

    def segments(self) -> list[tuple[float, float, float]]:
        """(start gib, end gib, tokens per GiB) of each hull segment, steepest first."""
        out = []
        for (x0, y0), (x1, y1) in zip(self.points, self.points[1:], strict=False):
            if x1 > x0:
                out.append((x0, x1, (y1 - y0) / (x1 - x0)))
        return out


def breakpoints(bins: dict[int, float], upper: Callable[[int], int], top_blocks: float) -> list[float]:
    """Sizes (blocks) where the curve may bend: every bin's edges, plus an even grid (0..top)."""
    pts = {0.0, float(top_blocks)}
    for lo, w in bins.items():
        if w > 0:
            pts.update((float(lo), float(upper(lo))))
    pts.update(top_blocks * i / 64 for i in range(65))
    return sorted(p for p in pts if 0 <= p <= top_blocks)


def hull_of(xs: Sequence[float], ys: Sequence[float]) -> Hull:
    """Upper concave hull of the points (monotone chain), from (0, 0)."""
    pts = sorted({(0.0, 0.0), *zip(xs, ys, strict=True)})
    hull: list[tuple[float, float]] = []
    for p in pts:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            # drop the middle point when it lies on or under the chord from hull[-2] to p
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    # a concave hull of a non-decreasing curve: cut where it would go down
    out = [hull[0]]
    for p in hull[1:]:
        if p[1] > out[-1][1]:
            out.append(p)
    return Hull(tuple(out))


def knee(hull: Hull, price_tokens_per_gib: float, cap_gib: float | None) -> tuple[float, str]:
    """The size where one more GiB stops paying (hull slope falls under the price), capped at the
    headroom; and which of the two set it."""
    size = 0.0
    for _x0, x1, slope in hull.segments():
        if slope < price_tokens_per_gib:
            break
        size = x1
    if cap_gib is not None and size > cap_gib:
        return max(0.0, cap_gib), "headroom"
    return size, "price"


def on_hull(hull: Hull, gib: float) -> float:
    """Tokens the hull gives at this size (linear between its points)."""
    pts = hull.points
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 <= gib <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (gib - x0) / (x1 - x0)
    return pts[-1][1]


def dtype_bytes(cache_dtype: str | None, model_dtype_bytes: int = 2) -> tuple[int, str]:
    """Bytes per K/V element of the pool now: vLLM's cache_dtype, 'auto' being the model's dtype
    (taken as 2 bytes, bf16/fp16, unless the pool says otherwise)."""
    d = (cache_dtype or "auto").lower()
    if d in DTYPE_BYTES:
        return DTYPE_BYTES[d], f"cache_dtype {d}"
    return model_dtype_bytes, f"cache_dtype {d}: the model's dtype, taken as {model_dtype_bytes} bytes (bf16/fp16)"


@dataclass(frozen=True)
class Pool:
    """The GPU pool as vLLM reported it (vllm:cache_config_info)."""

    blocks: float | None
    memory_bytes: float | None
    size_tokens: float | None
    cache_dtype: str | None
    gpu_memory_utilization: float | None


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def pool_of(cache_cfg: Any) -> Pool:
    c = cache_cfg if isinstance(cache_cfg, dict) else {}
    return Pool(
        blocks=_num(c.get("num_gpu_blocks")),
        memory_bytes=_num(c.get("kv_cache_memory_bytes")),
        size_tokens=_num(c.get("kv_cache_size_tokens")),
        cache_dtype=str(c.get("cache_dtype")) if c.get("cache_dtype") not in (None, "None") else None,
        gpu_memory_utilization=_num(c.get("gpu_memory_utilization")),
    )


@dataclass(frozen=True)
class Costs:
    """What a reloaded or GPU-hit token is worth, from vLLM's counters (None: unknown)."""

    prefill_s_per_token: float | None
    load_s_per_token: float  # 0 until a tier has loaded something


def _seconds(gpu_tokens: float, tier_tokens: float, costs: Costs) -> float | None:
    p = costs.prefill_s_per_token
    if p is None:
        return None
    return gpu_tokens * p + tier_tokens * max(0.0, p - costs.load_s_per_token)


def gpu_pool_levers(
    hits: Hits,
    pool_hits: Hits | None,
    block: int,
    pool: Pool,
    tier_blocks: float,
    costs: Costs,
    *,
    fp8_pool_tokens: float | None = None,
    gpu_total_bytes: float | None = None,
) -> dict[str, Any]:
    """What a larger GPU pool would give, on top of the current CPU tier (tier_blocks, 0: none).

    ``pool_hits(D)``: blocks a pool larger by D blocks would have kept (eviction distances < D,
    agent/kvevents/pool_model.py): GPU hits, no load. The CPU tier (of C' blocks, more where fp8
    halves its bytes per token) then reloads what it would have minus what the pool now keeps
    (taken to be among the tier's nearest reuses): not recomputed = max(pool, tier). Estimates:
    the pool also holds running requests, and vLLM's eviction is only close to LRU."""
    base_tier = hits(tier_blocks) * block
    out: dict[str, Any] = {"base_tier_reload_tokens": base_tier, "fp8": None, "larger_pool": []}
    if not pool.blocks or not block:
        out["why"] = "vLLM reported no num_gpu_blocks (vllm:cache_config_info): the GPU pool is unknown"
        return out
    if pool_hits is None:
        out["why"] = (
            "the agent sent no eviction distances (ReuseWindow.pool_bins, agent/kvevents/pool_model.py): "
            "update the agent to see what a larger GPU pool would keep"
        )
        return out

    def what_if(extra_blocks: float, tier: float) -> dict[str, Any]:
        gpu = pool_hits(extra_blocks) * block
        total = max(gpu, hits(tier) * block)
        tier_part = total - gpu
        saved = _seconds(gpu, tier_part, costs)
        base_s = _seconds(0.0, base_tier, costs)
        return {
            "extra_gpu_blocks": extra_blocks,
            "gpu_hit_tokens": gpu,
            "tier_reload_tokens": tier_part,
            "tokens_not_recomputed": total,
            "gain_tokens": total - base_tier,
            "gain_prefill_s": None if saved is None or base_s is None else saved - base_s,
        }

    now_bytes, now_src = dtype_bytes(pool.cache_dtype)
    if now_bytes <= 1:
        out["fp8"] = {"applies": False, "why": f"the pool already uses 1-byte KV ({now_src})"}
    else:
        ratio_dtype = now_bytes / 1.0
        if fp8_pool_tokens and pool.size_tokens:
            ratio = fp8_pool_tokens / pool.size_tokens
            exact = True
            ratio_src = (
                f"vLLM reported {fp8_pool_tokens:,.0f} tokens with cache_dtype fp8 on this instance against "
                f"{pool.size_tokens:,.0f} now (vllm:cache_config_info kv_cache_size_tokens): {ratio:.2f}x"
            )
        else:
            ratio = ratio_dtype
            exact = False
            ratio_src = (
                f"{now_src} -> 1 byte: {ratio:.2f}x the tokens in the same bytes (not yet reported by vLLM for "
                "this instance; the field saw 1.82x on an RTX 4070 where the pool bytes also moved)"
            )
        extra = pool.blocks * (ratio - 1.0)
        fp8 = what_if(extra, tier_blocks * ratio_dtype)  # the CPU tier's GiB hold ratio_dtype x the tokens too
        fp8.update(
            {
                "applies": True,
                "flag": "--kv-cache-dtype fp8",
                "pool_ratio": ratio,
                "pool_ratio_source": ratio_src,
                "pool_blocks": pool.blocks * ratio,
                "exact": False,
                "pool_exact": exact,
                "why_estimate": "the pool size is "
                + ("exact (vLLM reported it)" if exact else "an estimate from dtype bytes")
                + "; its hits are an estimate: from the GPU's eviction distances (LRU inclusion), while the "
                "pool also holds running requests",
                "note": FP8_OUTPUTS,
            }
        )
        out["fp8"] = fp8
    for factor in POOL_FACTORS:
        row = what_if(pool.blocks * (factor - 1.0), tier_blocks)
        row["factor"] = factor
        row["exact"] = False
        if pool.memory_bytes:
            target = round(pool.memory_bytes * factor)
            row["kv_cache_memory_bytes"] = target
            row["flag_memory_bytes"] = f"--kv-cache-memory-bytes {target}"
            if gpu_total_bytes and pool.gpu_memory_utilization is not None:
                u = pool.gpu_memory_utilization + (target - pool.memory_bytes) / gpu_total_bytes
                row["gpu_memory_utilization"] = round(u, 3) if u <= 0.98 else None
                row["flag_utilization"] = (
                    f"--gpu-memory-utilization {u:.3f}"
                    if u <= 0.98
                    else f"not reachable with --gpu-memory-utilization ({u:.3f} of the GPU; vLLM needs some for itself)"
                )
        out["larger_pool"].append(row)
    out["pool_source"] = (
        "vllm:cache_config_info: num_gpu_blocks, kv_cache_memory_bytes, cache_dtype, gpu_memory_utilization"
        + ("; GPU memory from the agent (kvscope:gpu_memory_total_bytes)" if gpu_total_bytes else "")
    )
    out["gpu_memory_utilization_basis"] = (
        "the extra pool bytes over the GPU's total memory, added to today's utilization (weights and "
        "activations taken as unchanged): an estimate"
    )
    return out


def disk_tier(
    hits: Hits, block: int, tier_blocks: float, unbounded_blocks: float, reach_blocks: float, bpt: float | None
) -> dict[str, Any]:
    """A disk tier behind the CPU tier (vLLM's TieringOffloadingSpec secondary fs tier): what it
    would reload that the CPU tier could not. Unbounded, as the disk tier is sized by its folder."""
    cpu = hits(tier_blocks) * block
    disk = max(0.0, unbounded_blocks * block - cpu)
    return {
        "cpu_tier_reload_tokens": cpu,
        "disk_reload_tokens": disk,
        "disk_gib_needed": reach_blocks * block * bpt / GIB if bpt else None,
        "pinned_gib": 0.0,
        "exact": False,
        "why_estimate": "an LRU disk tier holding every block the CPU tier drops; its loads are staged through "
        "the CPU tier and read at disk speed, which vLLM's counters have not measured here, so the seconds "
        "are not given",
        "flag": "offload_spec tiering + fs_tier (root_dir) on the profile (--kv-transfer-config "
        "TieringOffloadingSpec secondary_tiers)",
    }
