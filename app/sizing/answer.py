"""The sizing answer for one instance, every lever from its one event stream, and the host split.

``answer`` = the curve (``service.report``, stopped at the host's pinned headroom) plus:
- each point's pinned RAM (the tier pins exactly its size) and prefill seconds saved;
- the suggestion: the knee of the curve at a price (a GiB must save ``price`` of the computed
  prompt tokens), capped at the headroom (app/sizing/levers.py, app/sizing/headroom.py);
- a larger GPU pool (fp8 KV, --kv-cache-memory-bytes, --gpu-memory-utilization) and a disk tier
  behind the CPU tier, each saying whether it is exact or an estimate;
- the split of the host's headroom across its instances (app/sizing/split.py);
- KV events state and the flag to add (app/sizing/events.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agent.kvevents.reuse import bin_upper, hits_at
from agent.preflight import hybrid_from_cache_config
from app.context import AppContext
from app.derived.series_reader import SeriesQuery, read_series
from app.sizing import events
from app.sizing.curve import GIB, Figure, Totals, add_windows, bytes_per_token, current_tier
from app.sizing.headroom import Headroom, host_headroom
from app.sizing.levers import (
    DEFAULT_PRICE,
    Costs,
    Hull,
    breakpoints,
    disk_tier,
    gpu_pool_levers,
    hull_of,
    knee,
    pool_of,
)
from app.sizing.optimal import latest_bound, optimal_bound
from app.sizing.service import SizingError, measured, report
from app.sizing.split import Candidate, split
from app.storage.raw_store import series_meta
from app.storage.series_store import InstanceRow, get_instance, list_instances
from app.storage.sizing_store import SizingWindowRow, windows_in

FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True)
class Basis:
    """What one instance's sizing rests on: its summed windows and how blocks become bytes."""

    totals: Totals
    bpt: Figure
    current: Figure
    block: int
    bytes_per_block: float | None
    pool_bins: dict[int, float] | None  # eviction distances (None: the agent sent none)
    bound: tuple[float, int, list[list[float]]] | None = None  # the latest optimal-eviction bound

    def pool_hits(self, extra_blocks: float) -> float:
        return hits_at(self.pool_bins or {}, extra_blocks) if extra_blocks > 0 else 0.0

    def tier_blocks(self) -> float:
        if not self.current.value or not self.bytes_per_block:
            return 0.0
        return self.current.value * GIB / self.bytes_per_block

    def hull(self) -> Hull | None:
        t = self.totals
        if not self.bytes_per_block or not self.block or t.lookups <= 0:
            return None
        top = max(t.reach_blocks() * 1.1, 16.0, self.tier_blocks() * 1.5)
        xs = breakpoints(t.bins, bin_upper, top)
        return hull_of([b * self.bytes_per_block / GIB for b in xs], [t.hits(b) * self.block for b in xs])


def basis_of(ctx: AppContext, inst: InstanceRow, start: float, end: float, model_bpt: Figure | None) -> Basis:
    rows = windows_in(ctx.engine, int(inst["id"]), start, end)
    totals = add_windows(rows)
    cache_cfg, offload_cfg = inst.get("cache_config") or {}, inst.get("offload_config") or {}
    policy = offload_cfg.get("eviction_policy") if isinstance(offload_cfg, dict) else None
    totals.policy = "arc" if isinstance(policy, str) and policy.lower() == "arc" else "lru"  # as report()
    bpt = model_bpt or bytes_per_token(cache_cfg, offload_cfg)
    block = totals.block_size or 0
    bpb = bpt.value * block if bpt.value and block else None
    return Basis(totals, bpt, current_tier(cache_cfg, offload_cfg), block, bpb, pool_bins_of(rows), latest_bound(rows))


def pool_bins_of(rows: list[SizingWindowRow]) -> dict[int, float] | None:
    """The windows' eviction distances summed (None when no window carried any)."""
    out: dict[int, float] = {}
    seen = False
    for row in rows:
        pairs = (row.get("counts") or {}).get("pool_bins")
        if not isinstance(pairs, list):
            continue
        seen = True
        for pair in pairs:
            if isinstance(pair, list) and len(pair) == 2:
                lo, n = pair
                if isinstance(lo, int | float) and isinstance(n, int | float) and lo >= 0 and math.isfinite(n):
                    out[int(lo)] = out.get(int(lo), 0.0) + float(n)
    return out if seen else None


def costs_of(rep_measured: dict[str, Any], bpt: float | None) -> Costs:
    prefill = (rep_measured.get("prefill_s_per_computed_token") or {}).get("value")
    per_byte = (rep_measured.get("load_s_per_byte") or {}).get("value")
    load = per_byte * bpt if per_byte is not None and bpt else 0.0
    return Costs(prefill, load)


def fp8_pool_tokens(ctx: AppContext, instance_id: int, cache_cfg: Any) -> float | None:
    """The pool vLLM reported for this instance with fp8 KV and today's pool bytes, if it ever ran so."""
    mem = str((cache_cfg or {}).get("kv_cache_memory_bytes", "")) if isinstance(cache_cfg, dict) else ""
    found = []
    for meta in series_meta(ctx.engine, ["vllm:cache_config_info"], instance_id=instance_id):
        lab = meta.labels
        if str(lab.get("cache_dtype", "")).lower() in FP8 and mem and lab.get("kv_cache_memory_bytes") == mem:
            try:
                found.append(float(lab.get("kv_cache_size_tokens", "")))
            except ValueError:
                continue
    return max(found) if found else None


def gpu_total_bytes(ctx: AppContext, inst: InstanceRow, now: float) -> float | None:
    """The total memory of the instance's GPU (the smallest, if it uses several or is unknown)."""
    mine = {
        str(m.labels.get("gpu"))
        for m in series_meta(ctx.engine, ["kvscope:instance_gpu"], instance_id=int(inst["id"]))
        if m.labels.get("gpu") is not None
    }
    q = SeriesQuery(["kvscope:gpu_memory_total_bytes"], now - 300.0, now, host_id=int(inst["host_id"]))
    vals = [
        s.points[-1][1]
        for s in read_series(ctx.engine, q)
        if s.points and (not mine or str(s.labels.get("gpu")) in mine)
    ]
    return min(vals) if vals else None


def _suggestion(b: Basis, hull: Hull | None, room: Headroom, price: float, costs: Costs) -> dict[str, Any]:
    t, block = b.totals, b.block
    if hull is None or b.bytes_per_block is None:
        return {
            "offload_gib": None,
            "blocks": None,
            "reload_tokens": None,
            "saved_prefill_s": None,
            "capped_by": None,
            "why": "no suggestion in GiB: the tier's bytes per token are unknown (give the model's figures below)",
            "method": None,
        }
    lookups = t.lookups * block
    price_tokens = price * lookups
    size, capped_by = knee(hull, price_tokens, room.gib)
    blocks = size * GIB / b.bytes_per_block
    tokens = t.hits(blocks) * block
    p = costs.prefill_s_per_token
    saved = None if p is None else tokens * max(0.0, p - costs.load_s_per_token)
    money = f"a GiB must save {price:.1%} of the {lookups:,.0f} computed prompt tokens ({price_tokens:,.0f})"
    if size <= 0:
        why = (
            "the host has no pinned headroom left for a tier"
            if capped_by == "headroom"
            else f"no GiB of tier pays the price here ({money})"
        )
    elif capped_by == "headroom":
        why = (
            f"{size:.3g} GiB reloads {tokens:,.0f} prompt tokens: the host's pinned headroom ends there "
            f"(the knee at the price, {money}, lies further)"
        )
    else:
        why = (
            f"{size:.3g} GiB reloads {tokens:,.0f} prompt tokens; beyond it an extra GiB saves less than "
            f"the price ({money})"
        )
    return {
        "offload_gib": size if size > 0 else 0.0,
        "blocks": math.ceil(blocks),
        "reload_tokens": tokens,
        "saved_prefill_s": saved,
        "pinned_gib": size,
        "capped_by": capped_by,
        "price": price,
        "price_tokens_per_gib": price_tokens,
        "why": why,
        "method": "the knee of the curve's upper concave hull at the price of a GiB of pinned RAM, capped at "
        "the host's pinned headroom (not a share of an unbounded tier, which grows with the range)",
    }


def _exactness(rep: dict[str, Any], b: Basis) -> list[dict[str, Any]]:
    rate = float(rep.get("sampling", {}).get("rate") or 1.0)
    vllm_bytes = b.bpt.value is not None and b.bpt.source.startswith("vllm:")
    return [
        {
            "figure": "CPU tier reloads (the curve)",
            "exact": bool(b.totals.simulated()) or rate >= 1.0,
            "why": f"vLLM's offload tier simulated on every block at {len(b.totals.simulated())} sizes (exact "
            "there, linear between them); above the largest, stack distances"
            + ("" if rate >= 1.0 else f" SHARDS-sampled at rate {rate:.3g} (an estimate)")
            if b.totals.simulated()
            else "Mattson's stack distances of every GPU store, to the histogram's bin width, for an LRU tier"
            if rate >= 1.0
            else f"SHARDS-sampled at rate {rate:.3g}: an estimate, least accurate for small tiers",
        },
        {
            "figure": "GiB and pinned RAM per size",
            "exact": vllm_bytes,
            "why": f"bytes per token: {b.bpt.source}; the tier pins exactly its size (cpu_bytes_to_use)",
        },
        {
            "figure": "prefill seconds saved",
            "exact": False,
            "why": "reloaded tokens x vLLM's prefill seconds per computed token (which includes queueing, so an "
            "upper bound under concurrency) minus the measured load cost",
        },
        {
            "figure": "pinned headroom",
            "exact": False,
            "why": "a snapshot of the host's memory; other processes' use can change",
        },
        {
            "figure": "larger GPU pool (fp8, --kv-cache-memory-bytes, --gpu-memory-utilization)",
            "exact": False,
            "why": "the GPU's eviction distances: a pool D blocks larger keeps the D blocks evicted most "
            "recently (LRU inclusion); the pool also holds running requests",
        },
        {
            "figure": "optimal-eviction bound (capacity vs policy)",
            "exact": False,
            "why": (rep.get("optimal_bound") or {}).get("why")
            or "the agent has not sent one yet (it replays its last block accesses every 5 minutes at most)",
        },
        {
            "figure": "disk tier behind the CPU tier",
            "exact": False,
            "why": "an LRU disk holding what the CPU tier drops; disk read speed not measured",
        },
    ]


def answer(
    ctx: AppContext,
    instance_id: int,
    start: float,
    end: float,
    *,
    model_bpt: Figure | None = None,
    price: float = DEFAULT_PRICE,
    with_split: bool = True,
) -> dict[str, Any]:
    inst = get_instance(ctx.engine, instance_id)
    if inst is None:
        raise SizingError(f"no instance {instance_id}", 404)
    now = ctx.now()
    b = basis_of(ctx, inst, start, end, model_bpt)
    own = (b.current.value or 0.0) * GIB
    room = host_headroom(ctx.engine, int(inst["host_id"]), now, give_back_cap=own)
    cap = None if room.gib is None or not b.bytes_per_block else max(room.gib, 1e-3)
    rep = report(ctx, instance_id, start, end, model_bpt=model_bpt, max_gib=cap)
    costs = costs_of(rep.get("measured") or {}, b.bpt.value)
    for p in rep.get("sizes") or []:
        p["pinned_gib"] = p.get("offload_gib")
    rep["headroom"] = room.as_dict() | {"curve_stops_at_gib": cap}
    hull = b.hull()
    if rep.get("sizes"):
        rep["recommendation"] = _suggestion(b, hull, room, price, costs)
    cache_cfg = inst.get("cache_config") or {}
    if b.block and b.totals.lookups > 0:
        rep["levers"] = {
            "gpu_pool": gpu_pool_levers(
                b.totals.hits,
                b.pool_hits if b.pool_bins is not None else None,
                b.block,
                pool_of(cache_cfg),
                b.tier_blocks(),
                costs,
                fp8_pool_tokens=fp8_pool_tokens(ctx, instance_id, cache_cfg),
                gpu_total_bytes=gpu_total_bytes(ctx, inst, now),
            ),
            "disk_tier": disk_tier(
                b.totals.hits,
                b.block,
                b.tier_blocks(),
                b.totals.hits(math.inf),
                b.totals.reach_blocks(),
                b.bpt.value,
            ),
        }
    rep["optimal_bound"] = optimal_bound(b.bound, b.block, b.bytes_per_block, b.totals.kv_groups)
    rep["exactness"] = _exactness(rep, b)
    rep["price"] = price
    rep["host_id"] = int(inst["host_id"])
    rep["host"] = inst.get("host")
    rep["kv_events"] = events.state(ctx, inst, now)
    if with_split:
        rep["host_split"] = host_split(ctx, int(inst["host_id"]), start, end, price=price)
    return rep


def host_split(
    ctx: AppContext, host_id: int, start: float, end: float, *, price: float = DEFAULT_PRICE
) -> dict[str, Any]:
    """Where the host's pinned headroom goes: the split across its instances that saves the most."""
    now = ctx.now()
    insts = [i for i in list_instances(ctx.engine) if int(i["host_id"]) == host_id]
    if not insts:
        raise SizingError(f"no host {host_id} with instances", 404)
    tiers = sum((current_tier(i.get("cache_config") or {}, i.get("offload_config") or {}).value or 0.0) for i in insts)
    room = host_headroom(ctx.engine, host_id, now, give_back_cap=tiers * GIB)  # only the tiers a restart frees
    cands, left_out = [], []
    for inst in insts:
        b = basis_of(ctx, inst, start, end, None)
        hybrid, hybrid_why = hybrid_from_cache_config(dict(inst.get("cache_config") or {}))
        hull = None if hybrid else b.hull()
        if hull is None:
            if hybrid:
                why = f"a hybrid model ({hybrid_why}): vLLM cannot load its offloaded blocks back"
            elif b.totals.lookups <= 0:
                why = "no KV events in this range"
            else:
                why = f"bytes per token unknown ({b.bpt.source})"
            left_out.append({"instance_id": int(inst["id"]), "instance": inst.get("url"), "why": why})
            continue
        costs = costs_of(measured(ctx, int(inst["id"]), start, end), b.bpt.value)
        value = (
            None if costs.prefill_s_per_token is None else max(0.0, costs.prefill_s_per_token - costs.load_s_per_token)
        )
        cands.append(
            Candidate(
                int(inst["id"]),
                str(inst.get("url")),
                hull,
                value,
                price * b.totals.lookups * b.block,
                b.current.value or 0.0,
            )
        )
    out = split(cands, room.gib)
    out.update({"host_id": host_id, "host": insts[0].get("host"), "headroom": room.as_dict(), "left_out": left_out})
    return out
