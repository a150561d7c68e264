"""Cache sizing on the app side: store pushed windows, answer the curve, turn a size into a profile.

- ``push_hook``: every ``ReuseWindow`` of a push becomes a row (instances of the pushing host only).
- ``report``: the curve of one instance over a range (``app/sizing/curve.py``), with where each
  number came from.
- ``profile_for_size``: the instance's current profile with ``offload_size_gib`` set to the
  chosen size, saved as a new profile (or the same one again) for the existing rollout flow:
  the apply page previews it, runs the preflight, and the agent restarts vLLM.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from app.context import AppContext
from app.controller.derived_profiles import save_derived_profile
from app.controller.profiles import ProfileError
from app.derived.series_reader import SeriesQuery, read_series
from app.sizing.curve import Figure, add_windows, bytes_per_token, current_tier, curve, reconcile
from app.storage import rollouts_store as rs
from app.storage.series_store import get_instance
from app.storage.sizing_store import SizingWindowRow, prune_windows, store_windows, windows_in
from kvcore.protocol import PushBatch, ReuseWindow
from kvcore.series import increase

log = logging.getLogger("kvscope.sizing")
MAX_WINDOWS_PER_PUSH = 64
MAX_BINS = 2048
MAX_OFFLOAD_GIB = 4096.0  # the profile's own bound
RETENTION_S = 30 * 86400.0
MAX_COUNTER_RANGE_S = 86400.0  # measured counters come from raw samples: a day at most
PRUNE_JOB = "sizing_prune"


class SizingError(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


MAX_POINTS = 64
MAX_OPT_ACCESSES = 1 << 24


def check_window(i: int, w: ReuseWindow) -> str | None:
    """Why one reuse window is refused (None when fine): bounded counts, sane times."""
    if not w.instance or len(w.instance) > 1024:
        return f"reuse.{i}.instance must be 1-1024 characters"
    if len(w.bins) > MAX_BINS or any(len(b) != 2 or b[0] < 0 for b in w.bins):
        return f"reuse.{i}.bins: at most {MAX_BINS} [lower edge >= 0, weight] pairs"
    for name, pts in (("points", w.points), ("arc_points", w.arc_points)):
        if len(pts) > MAX_POINTS or any(len(p) != 2 or not 0 < p[0] <= 1 << 40 or p[1] < 0 for p in pts):
            return f"reuse.{i}.{name}: at most {MAX_POINTS} [tier chunks > 0, chunks loaded >= 0] pairs"
    if len(w.pool_bins) > MAX_BINS or any(len(b) != 2 or b[0] < 0 or b[1] < 0 for b in w.pool_bins):
        return f"reuse.{i}.pool_bins: at most {MAX_BINS} [lower edge >= 0, count >= 0] pairs"
    if len(w.opt_bound) > MAX_POINTS or any(
        len(p) != 4 or not 0 < p[0] <= 1 << 40 or not 0 <= p[1] <= p[2] <= p[3] <= 1 << 40 for p in w.opt_bound
    ):
        return f"reuse.{i}.opt_bound: at most {MAX_POINTS} [tier chunks > 0, 0 <= lru <= opt <= ceiling] rows"
    if not 0 <= w.opt_accesses <= MAX_OPT_ACCESSES:
        return f"reuse.{i}.opt_accesses must be 0-{MAX_OPT_ACCESSES}"
    if w.end < w.start or not 0 < w.rate <= 1:
        return f"reuse.{i}: end before start, or a sampling rate outside (0, 1]"
    if w.block_size is not None and not 0 < w.block_size <= 1 << 20:
        return f"reuse.{i}.block_size out of range"
    if not 1 <= w.kv_groups <= 1024:
        return f"reuse.{i}.kv_groups out of range"
    return None


def check_windows(batch: PushBatch) -> str | None:
    """Why a push's reuse windows are refused as a whole (None when fine): too many of them."""
    if len(batch.reuse) > MAX_WINDOWS_PER_PUSH:
        return f"{len(batch.reuse)} reuse windows in one push; at most {MAX_WINDOWS_PER_PUSH}"
    return None


def good_windows(batch: PushBatch) -> list[ReuseWindow]:
    """The push's windows less the refused ones: one bad instance must not drop the others'."""
    out = []
    for i, w in enumerate(batch.reuse):
        why = check_window(i, w)
        if why is None:
            out.append(w)
        else:
            log.warning("reuse window of %s from %s dropped: %s", w.instance[:200], batch.host, why)
    return out


def push_hook(ctx: AppContext) -> Any:
    def hook(batch: PushBatch, host_id: int, now: float) -> None:
        if not batch.reuse or not host_id:
            return
        why = check_windows(batch)
        if why is not None:
            log.warning("reuse windows from %s dropped: %s", batch.host, why)
            return
        store_windows(ctx.engine, host_id, good_windows(batch), now)

    return hook


def prune_job(ctx: AppContext, now: float) -> None:
    prune_windows(ctx.engine, now - RETENTION_S)


def report(
    ctx: AppContext,
    instance_id: int,
    start: float,
    end: float,
    *,
    model_bpt: Figure | None = None,
    max_gib: float | None = None,
) -> dict[str, Any]:
    inst = get_instance(ctx.engine, instance_id)
    if inst is None:
        raise SizingError(f"no instance {instance_id}", 404)
    rows = windows_in(ctx.engine, instance_id, start, end)
    totals = add_windows(rows)
    cache_cfg, offload_cfg = inst.get("cache_config") or {}, inst.get("offload_config") or {}
    policy = offload_cfg.get("eviction_policy") if isinstance(offload_cfg, dict) else None
    totals.policy = "arc" if isinstance(policy, str) and policy.lower() == "arc" else "lru"
    bpt = model_bpt or bytes_per_token(cache_cfg, offload_cfg)
    out = curve(totals, bpt, current_tier(cache_cfg, offload_cfg), max_gib=max_gib)
    gpu_blocks = cache_cfg.get("num_gpu_blocks") if isinstance(cache_cfg, dict) else None
    out.update(
        {
            "instance_id": instance_id,
            "instance": inst.get("url"),
            "simulated": bool(inst.get("simulated")),
            "start": start,
            "end": end,
            "gpu_pool_blocks": {"value": gpu_blocks, "source": "vllm:cache_config_info: num_gpu_blocks"},
            "sampling": {
                "rate": totals.rate,
                "windows": totals.windows,
                "messages": totals.messages,
                "events": totals.events,
                "lost": totals.lost,
                "garbage": totals.garbage,
                "epochs": totals.epochs,
                "reannounced_blocks": totals.reannounced,
                "tier_blocks_stored": totals.tier_stored,
                "tier_blocks_removed": totals.tier_removed,
            },
            "measured": measured(ctx, instance_id, start, end),
            "method": totals.method(),
        }
    )
    # the counters over the span the counted batches cover (their own vLLM timestamps): a range that
    # starts before the agent subscribed holds computed tokens no counted event announced, and
    # events announced before the counter's first sample are in its baseline, not its increase
    first = first_sample_ts(ctx, COMPUTED_COUNTER, instance_id, start, end)
    kept = [r for r in rows if first is None or _window_from(r) >= first]
    rec = totals if len(kept) == len(rows) else add_windows(kept)
    lo = max(start, rec.first_ts) if rec.first_ts is not None else start
    hi = min(end, rec.last_ts) if rec.last_ts is not None else end
    # from the counter's last sample at or before the span (its increase from there is what the
    # span's events computed; the agent scrapes and takes its window on the same tick)
    lo = max(sample_before(ctx, COMPUTED_COUNTER, instance_id, lo) or lo, first or lo)
    m = out["measured"] if (lo, hi) == (start, end) or hi <= lo else measured(ctx, instance_id, lo, hi)
    out["reconciliation"] = reconcile(rec, m.get("by_source") or {}, m.get("requests"), m.get("generation_tokens"))
    out["reconciliation"]["span"] = [lo, hi]
    out["reconciliation"]["windows_left_out"] = len(rows) - len(kept)
    add_saved_seconds(out)
    return out


COMPUTED_COUNTER = "vllm:prompt_tokens_by_source_total"
SAMPLE_LOOKBACK_S = 300.0


def _window_from(row: SizingWindowRow) -> float:
    """When a window's counted batches begin (vLLM's timestamps; the window's start without them)."""
    first = (row.get("counts") or {}).get("first_ts")
    return float(first) if isinstance(first, int | float) and math.isfinite(first) else float(row["start_ts"])


def first_sample_ts(ctx: AppContext, name: str, instance_id: int, start: float, end: float) -> float | None:
    """The earliest point of any series `name` in the range (None without one)."""
    firsts = [
        sp.points[0][0]
        for sp in read_series(ctx.engine, SeriesQuery([name], start, end, instance_id=instance_id))
        if sp.points
    ]
    return min(firsts) if firsts else None


def sample_before(ctx: AppContext, name: str, instance_id: int, at: float) -> float | None:
    """The latest point of any series `name` at or before `at` (looking back SAMPLE_LOOKBACK_S)."""
    pts = [
        t
        for sp in read_series(ctx.engine, SeriesQuery([name], at - SAMPLE_LOOKBACK_S, at, instance_id=instance_id))
        for t, _ in sp.points
        if t <= at
    ]
    return max(pts) if pts else None


def _increase(ctx: AppContext, name: str, instance_id: int, start: float, end: float) -> dict[str, float]:
    """Reset-corrected increase of every series `name` over the range, by its `source` label."""
    out: dict[str, float] = {}
    for sp in read_series(ctx.engine, SeriesQuery([name], start, end, instance_id=instance_id)):
        key = str(sp.labels.get("source", ""))
        out[key] = out.get(key, 0.0) + increase(sp.points)
    return out


def measured(ctx: AppContext, instance_id: int, start: float, end: float) -> dict[str, Any]:
    """vLLM's own counters over the range, to set beside the prediction: prompt tokens by source,
    and the prefill seconds per computed token and load seconds per byte that turn reloaded tokens
    into prefill seconds saved."""
    if end - start > MAX_COUNTER_RANGE_S:
        return {"note": "measured counters are shown for ranges of a day or less"}
    total = _increase(ctx, "vllm:prompt_tokens_total", instance_id, start, end)
    by_source = _increase(ctx, "vllm:prompt_tokens_by_source_total", instance_id, start, end)
    prefill_s = sum(_increase(ctx, "vllm:request_prefill_time_seconds_sum", instance_id, start, end).values())
    load_s = sum(_increase(ctx, "vllm:kv_offload_load_time_total", instance_id, start, end).values())
    load_bytes = sum(_increase(ctx, "vllm:kv_offload_load_bytes_total", instance_id, start, end).values())
    computed = by_source.get("local_compute", 0.0)
    # requests that finished, for the partial-block allowance: the request_prompt_tokens histogram
    # (kvcore/normalise.py does not keep it) where a store has it, else request_success_total
    requests = _increase(ctx, "vllm:request_prompt_tokens_count", instance_id, start, end) or _increase(
        ctx, "vllm:request_success_total", instance_id, start, end
    )
    generated = _increase(ctx, "vllm:generation_tokens_total", instance_id, start, end)
    return {
        "prompt_tokens": sum(total.values()) if total else None,
        "requests": sum(requests.values()) if requests else None,
        "generation_tokens": sum(generated.values()) if generated else None,
        "by_source": by_source,
        "source": "vllm:prompt_tokens_total and vllm:prompt_tokens_by_source_total, increase over the range",
        "prefill_s_per_computed_token": {
            "value": prefill_s / computed if prefill_s > 0 and computed > 0 else None,
            "source": "vllm:request_prefill_time_seconds_sum / prompt_tokens_by_source{local_compute} (the prefill "
            "phase's whole time, so an upper bound of the compute cost)",
        },
        "load_s_per_byte": {
            "value": load_s / load_bytes if load_s > 0 and load_bytes > 0 else None,
            "source": "vllm:kv_offload_load_time_total / vllm:kv_offload_load_bytes_total",
        },
    }


def add_saved_seconds(rep: dict[str, Any]) -> None:
    """``saved_prefill_s`` on every size: reloaded tokens x (prefill s/token - load s/token), when
    vLLM's counters gave the prefill speed (the load cost is 0 when no tier has loaded yet: said so)."""
    m = rep.get("measured") or {}
    prefill = (m.get("prefill_s_per_computed_token") or {}).get("value")
    per_byte = (m.get("load_s_per_byte") or {}).get("value")
    bpt = (rep.get("bytes_per_token") or {}).get("value")
    load = per_byte * bpt if per_byte is not None and bpt else 0.0
    rep["saved_prefill_s_basis"] = (
        None
        if prefill is None
        else f"{prefill * 1e3:.3f} ms prefill per computed token"
        + (f" - {load * 1e3:.3f} ms load per token" if load else " (no tier load measured: load cost taken as 0)")
    )
    for point in rep.get("sizes") or []:
        point["saved_prefill_s"] = None if prefill is None else point["reload_tokens"] * max(0.0, prefill - load)


def _profile_name(instance_id: int, gib: float) -> str:
    text = f"{gib:.2f}".rstrip("0").rstrip(".")
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"sized-{instance_id}-{text}g")[:63]


def profile_for_size(ctx: AppContext, instance_id: int, offload_gib: Any, *, author: str) -> str:
    """A profile like the instance's current one with this offload size; its name (created if new)."""
    try:
        gib = float(offload_gib)
    except OverflowError:  # an integer of hundreds of digits (10**400): no float holds it
        raise SizingError(f"offload_gib must be > 0 and <= {MAX_OFFLOAD_GIB:g}", 422) from None
    except (TypeError, ValueError):
        raise SizingError("offload_gib must be a number of GiB", 422) from None
    if not math.isfinite(gib) or not 0 < gib <= MAX_OFFLOAD_GIB:
        raise SizingError(f"offload_gib must be > 0 and <= {MAX_OFFLOAD_GIB:g}", 422)
    gib = round(gib, 2) or 0.01
    if get_instance(ctx.engine, instance_id) is None:
        raise SizingError(f"no instance {instance_id}", 404)
    try:
        return save_derived_profile(
            ctx,
            instance_id,
            _profile_name(instance_id, gib),
            {"offload_size_gib": gib},
            f"with a {gib:g} GiB CPU offload tier (from the sizing curve)",
            author=author,
            note="sizing curve",
        )
    except ProfileError as exc:
        raise SizingError(f"cannot build a profile with that size: {exc}", 422) from None
    except rs.StoreConflict as exc:
        raise SizingError(str(exc), 409) from None
