"""From a workload run's record to the numbers compared: per-run summaries and per-arm samples.

A record is what agent.workloads.runner.execute_run returns: the client-side request timings and
the server's counter deltas over the run. Everything here tolerates missing parts (an `observe`
run has no requests; an old server has no by-source counter).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.ab.stats import percentile
from kvcore import kv_vocabulary as kv

# vLLM's source labels in the order the A/B pages list them, named as everywhere else
SOURCES = tuple(src.vllm_label for src in (kv.RECOMPUTE, kv.GPU_HIT, kv.OFFLOAD_RELOAD))
SOURCE_LABELS = {label: kv.source_label(label) for label in SOURCES}


@dataclass(frozen=True)
class Metric:
    """One compared number. `level` request: one value per request (hierarchical bootstrap of the
    requests tagged `tags`); run: one value per run (`key` in the run summary)."""

    key: str
    label: str
    unit: str  # ms | tok/s | ratio | GB/s | bytes | count
    level: str  # request | run
    stat: str = "mean"  # for request level: p50 / p95 / p99 / mean
    field: str = "ttft_s"  # request field (seconds are shown as ms)
    tags: tuple[str, ...] = ()  # request tags included (empty: all but warmup)
    lower_is_better: bool = True


def _tag_ok(r: dict[str, Any], tags: tuple[str, ...]) -> bool:
    tag = r.get("tag")
    return tag != "warmup" and (not tags or tag in tags)


def request_values(record: dict[str, Any], field: str, tags: tuple[str, ...]) -> list[float]:
    """The field of the successful requests with one of `tags`, seconds -> milliseconds. For a
    simulated server that sent its modeled TTFT on every request (timing_source 'sim-model'), TTFT
    is that modeled value, not the client's wall clock."""
    if field == "ttft_s" and record.get("timing_source") == "sim-model":
        field = "model_ttft_s"
    out: list[float] = []
    for r in record.get("requests") or []:
        if not isinstance(r, dict) or not r.get("ok") or not _tag_ok(r, tags):
            continue
        v = r.get(field)
        if isinstance(v, int | float) and math.isfinite(v):
            out.append(float(v) * 1000.0 if field.endswith("_s") else float(v))
    return out


def summarise_run(record: dict[str, Any], focus_tags: tuple[str, ...] = ()) -> dict[str, Any]:
    """Flat per-run numbers for tables, charts, CSV and the run-level comparisons."""
    reqs = [r for r in record.get("requests") or [] if isinstance(r, dict) and r.get("tag") != "warmup"]
    ok = [r for r in reqs if r.get("ok")]
    s: dict[str, Any] = {"requests": len(reqs), "errors": len(reqs) - len(ok)}
    s["error_rate"] = (s["errors"] / len(reqs)) if reqs else 0.0
    by_tag: dict[str, list[float]] = {}
    ttft_field = "model_ttft_s" if record.get("timing_source") == "sim-model" else "ttft_s"
    s["timing_source"] = record.get("timing_source", "client")
    for r in ok:
        v = r.get(ttft_field)
        if isinstance(v, int | float) and math.isfinite(v):
            by_tag.setdefault(str(r.get("tag")), []).append(float(v) * 1000.0)
    all_ttft = sorted(request_values(record, "ttft_s", ()))
    focus = sorted(request_values(record, "ttft_s", focus_tags)) if focus_tags else all_ttft
    for q in (50, 95, 99):
        s[f"ttft_p{q}_ms"] = percentile(all_ttft, q) if all_ttft else None
        s[f"focus_ttft_p{q}_ms"] = percentile(focus, q) if focus else None
    for tag, vals in sorted(by_tag.items()):
        s[f"ttft_{tag}_p50_ms"] = percentile(sorted(vals), 50)
    itl = request_values(record, "itl_s", ())
    s["itl_mean_ms"] = (sum(itl) / len(itl)) if itl else None
    elapsed = record.get("elapsed_s")
    out_tokens = sum(int(r.get("output_tokens") or 0) for r in ok)
    s["output_tokens"] = out_tokens
    s["throughput_tok_s"] = (out_tokens / elapsed) if isinstance(elapsed, int | float) and elapsed > 0 else None
    s["elapsed_s"] = elapsed
    c = record.get("counters") or {}
    s["counters_valid"] = bool(c.get("valid", False)) if c else False
    shares = c.get("share_by_source") or {}
    for src in SOURCES:
        s[f"share_{src}"] = shares.get(src, 0.0 if shares else None)
        s[f"tokens_{src}"] = (c.get("tokens_by_source") or {}).get(src)
    for key in (
        *(d.run_key for d in kv.HIT_RATES),  # gpu_hit_rate, external_hit_rate (offload), overall_hit_rate
        "load_gbps",
        "store_gbps",
        "load_bytes",
        "store_bytes",
        "preemptions",
        "configured_offload_bytes",
        "prompt_tokens",
    ):
        s[key] = c.get(key)
    server = c.get("server") or {}
    for kind in ("ttft", "itl"):
        h = server.get(kind) or {}
        for q in (50, 95, 99):
            v = h.get(f"p{q}_s")
            s[f"server_{kind}_p{q}_ms"] = v * 1000.0 if isinstance(v, int | float) else None
        m = h.get("mean_s")
        s[f"server_{kind}_mean_ms"] = m * 1000.0 if isinstance(m, int | float) else None
    s["host_pinned_resident_bytes"] = record.get("host_pinned_resident_bytes")
    raw_foreign = record.get("foreign")
    foreign: dict[str, Any] = raw_foreign if isinstance(raw_foreign, dict) else {}
    s["foreign_requests"] = foreign.get("requests")
    s["foreign_prompt_tokens"] = foreign.get("prompt_tokens")
    s["foreign_request_share"] = foreign.get("request_share")
    s["foreign_prompt_token_share"] = foreign.get("prompt_token_share")
    plan = (record.get("driver") or {}).get("plan") if isinstance(record.get("driver"), dict) else None
    s["probe_plan"] = plan.get("text") if isinstance(plan, dict) else None
    srv = record.get("server") or {}
    s["reset"] = record.get("reset")
    s["version"] = srv.get("version")
    s["model"] = srv.get("model")
    return s


def arm_samples(records: list[dict[str, Any]], metric: Metric, focus_tags: tuple[str, ...] = ()) -> list[list[float]]:
    """One list per run: the metric's observations in that run (empty runs dropped)."""
    out: list[list[float]] = []
    for rec in records:
        if metric.level == "request":
            vals = request_values(rec, metric.field, metric.tags)
        else:
            v = summarise_run(rec, focus_tags).get(metric.key)
            vals = [float(v)] if isinstance(v, int | float) and math.isfinite(v) else []
        if vals:
            out.append(vals)
    return out


def contamination(record: dict[str, Any], max_share: float) -> str | None:
    """Why a run's numbers are not the experiment's own, or None: requests or prompt tokens the run
    did not send (other clients of the server) above `max_share` of what the server served."""
    foreign = record.get("foreign")
    if not isinstance(foreign, dict):
        return None
    parts = []
    rs, ts = foreign.get("request_share"), foreign.get("prompt_token_share")
    if isinstance(rs, int | float) and rs > max_share:
        parts.append(f"{foreign.get('requests')} requests ({rs * 100:.0f}% of those served)")
    if isinstance(ts, int | float) and ts > max_share:
        parts.append(f"{foreign.get('prompt_tokens'):,} prompt tokens ({ts * 100:.0f}%)")
    if not parts:
        return None
    return (
        "foreign traffic during the run: "
        + " and ".join(parts)
        + f" that the experiment did not send (over the {max_share * 100:.0f}% allowed)"
    )
