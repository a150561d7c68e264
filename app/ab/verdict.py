"""The verdict of an experiment: B - A for each metric with a bootstrap CI, in plain words.

Headline metrics (the ones the verdict speaks about) depend on the workload: for `probe`, TTFT of
the reload request (a prefix evicted from the GPU pool, asked again) at p50/p95/p99 and ITL; for
traffic workloads, TTFT p50/p95/p99 of all requests, ITL and throughput; for `observe`, the
server's own histograms. Their intervals are Bonferroni-corrected so that all of them together
hold at 95%: a difference is called only when its CI excludes zero. Secondary metrics (shares by
source, hit rates, transfer rates, server-side TTFT ...) are shown with plain 95% intervals and
are not part of the call.
"""

from __future__ import annotations

from typing import Any

from app.ab.results import SOURCE_LABELS, Metric, arm_samples, summarise_run
from app.ab.stats import Interval, bonferroni_level, bootstrap_diffs, stat_fn
from kvcore import kv_vocabulary as kv

FAMILY_LEVEL = 0.95
GIB = 1024**3
MIN_RUNS = 3  # completed runs per arm for a verdict; fewer is "inconclusive: too few runs"
INCONCLUSIVE = "inconclusive: too few runs"
# A run in which other clients sent more than this share of the requests or prompt tokens is
# left out of the verdict (flagged, with the figures): 5% foreign load moves latencies visibly
DEFAULT_MAX_FOREIGN_SHARE = 0.05


def _ttft(tags: tuple[str, ...], what: str) -> list[Metric]:
    return [Metric(f"ttft_p{q}", f"TTFT p{q}{what}", "ms", "request", f"p{q}", "ttft_s", tags) for q in (50, 95, 99)]


ITL = Metric("itl_mean", "ITL (mean)", "ms", "request", "mean", "itl_s")
THROUGHPUT = Metric("throughput_tok_s", "output throughput", "tok/s", "run", lower_is_better=False)


def headline_metrics(kind: str) -> list[Metric]:
    if kind == "probe":
        return [*_ttft(("reload",), " on evicted prefixes"), ITL]
    if kind == "observe":
        return [
            Metric("server_ttft_p50_ms", "server TTFT p50", "ms", "run"),
            Metric("server_ttft_p95_ms", "server TTFT p95", "ms", "run"),
            Metric("server_itl_mean_ms", "server ITL (mean)", "ms", "run"),
        ]
    return [*_ttft((), ""), ITL, THROUGHPUT]


def focus_tags(kind: str) -> tuple[str, ...]:
    return ("reload",) if kind == "probe" else ()


def secondary_metrics(kind: str) -> list[Metric]:
    out = []
    if kind == "probe":
        out += [
            Metric("ttft_cold_p50_ms", "TTFT p50, cold prefix", "ms", "run"),
            Metric("ttft_hit_p50_ms", "TTFT p50, GPU hit", "ms", "run"),
        ]
    if kind != "observe":
        out += [Metric(f"server_ttft_p{q}_ms", f"server TTFT p{q} (histogram delta)", "ms", "run") for q in (50, 95)]
    out += [
        Metric(
            "share_external_kv_transfer",
            "share of prompt tokens reloaded from the offload tier",
            "ratio",
            "run",
            lower_is_better=False,
        ),
        Metric(
            "share_local_cache_hit",
            "share of prompt tokens from the GPU prefix cache",
            "ratio",
            "run",
            lower_is_better=False,
        ),
        Metric("share_local_compute", "share of prompt tokens recomputed", "ratio", "run"),
        Metric(kv.HIT_GPU.run_key, "GPU prefix-cache hit rate", "ratio", "run", lower_is_better=False),
        Metric(kv.HIT_OFFLOAD.run_key, "offload-tier hit rate", "ratio", "run", lower_is_better=False),
        Metric("load_gbps", "offload load rate (CPU->GPU)", "GB/s", "run", lower_is_better=False),
        Metric("store_gbps", "offload store rate (GPU->CPU)", "GB/s", "run", lower_is_better=False),
        Metric("store_bytes", "bytes stored to the offload tier per run", "bytes", "run"),
        Metric("preemptions", "preemptions per run", "count", "run"),
        Metric("error_rate", "request error rate", "ratio", "run"),
    ]
    return out


def _compare(
    records_a: list[dict[str, Any]],
    records_b: list[dict[str, Any]],
    metrics: list[Metric],
    kind: str,
    seed: int,
    level: float,
    n_boot: int,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    tags = focus_tags(kind)
    # Request-level metrics over the same field and tags share one bootstrap (one sort per resample).
    groups: dict[tuple[str, str, tuple[str, ...]], list[Metric]] = {}
    for m in metrics:
        gkey = (m.level, m.field, m.tags) if m.level == "request" else (m.level, m.key, ())
        groups.setdefault(gkey, []).append(m)
    results: dict[str, Interval | None] = {}
    for gi, group in enumerate(groups.values()):
        first = group[0]
        a = arm_samples(records_a, first, tags)
        b = arm_samples(records_b, first, tags)
        fns = [stat_fn(m.stat) for m in group]
        ivs = bootstrap_diffs(a, b, fns, seed=seed * 1000 + gi, n_boot=n_boot, level=level)
        for i, m in enumerate(group):
            results[m.key] = ivs[i] if ivs else None
    for m in metrics:
        iv = results.get(m.key)
        row: dict[str, Any] = {
            "key": m.key,
            "label": m.label,
            "unit": m.unit,
            "level": m.level,
            "lower_is_better": m.lower_is_better,
        }
        if iv is None:
            row.update(available=False, significant=False, better=None)
        else:
            better = None
            if iv.significant:
                b_lower = iv.hi < 0
                better = "B" if b_lower == m.lower_is_better else "A"
            row.update(
                available=True,
                a=iv.a,
                b=iv.b,
                diff=iv.diff,
                lo=iv.lo,
                hi=iv.hi,
                rel=iv.rel,
                rel_lo=iv.rel_lo,
                rel_hi=iv.rel_hi,
                confidence=iv.level,
                n_a=iv.n_a,
                n_b=iv.n_b,
                runs_a=iv.runs_a,
                runs_b=iv.runs_b,
                significant=iv.significant,
                better=better,
            )
        out.append(row)
    return out


def experiment_plan(
    kind: str, *, min_runs: int = MIN_RUNS, max_foreign_share: float = DEFAULT_MAX_FOREIGN_SHARE
) -> dict[str, Any]:
    """What the verdict will test, fixed when the experiment is created (before any run) and shown
    on its page: the primary metric, the headline family, the test and its level, the runs needed,
    and when a run counts as contaminated by traffic the experiment did not send."""
    head = headline_metrics(kind)
    level = bonferroni_level(FAMILY_LEVEL, len(head))
    return {
        "primary": {"key": head[0].key, "label": head[0].label},
        "headline": [m.key for m in head],
        "headline_labels": [m.label for m in head],
        "family_confidence": FAMILY_LEVEL,
        "per_metric_confidence": level,
        "min_runs": min_runs,
        "max_foreign_share": max_foreign_share,
        "test": (
            "B - A for each headline metric, hierarchical bootstrap (runs with replacement, then requests "
            "within each run), widened by sqrt(n/(n-1)) x t(df)/z for n runs (Student's t, df = runs - 2); "
            "a difference is called only when its "
            f"{level * 100:.2f}% interval excludes zero (Bonferroni: the {len(head)} headline metrics hold "
            f"together at {FAMILY_LEVEL * 100:.0f}%), never from an interval of zero width; at least "
            f"{min_runs} completed runs per arm, else inconclusive"
        ),
    }


def compute_verdict(
    kind: str,
    records_a: list[dict[str, Any]],
    records_b: list[dict[str, Any]],
    *,
    seed: int,
    n_boot: int = 2000,
    profile_a: str = "A",
    profile_b: str = "B",
    plan: dict[str, Any] | None = None,
    excluded: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The verdict over the completed, uncontaminated runs of each arm. `plan` (experiment_plan,
    stored when the experiment was created) fixes the headline metrics, their level and the runs
    needed; `excluded` lists runs left out and why ({idx, arm, reason})."""
    plan = plan or experiment_plan(kind)
    keys = [str(k) for k in plan.get("headline") or []]
    head = [m for m in headline_metrics(kind) if not keys or m.key in keys] or headline_metrics(kind)
    level = float(plan.get("per_metric_confidence") or bonferroni_level(FAMILY_LEVEL, len(head)))
    min_runs = int(plan.get("min_runs") or MIN_RUNS)
    headline = _compare(records_a, records_b, head, kind, seed, level, n_boot)
    secondary = _compare(records_a, records_b, secondary_metrics(kind), kind, seed + 7, FAMILY_LEVEL, n_boot)
    tags = focus_tags(kind)
    sums_a = [summarise_run(r, tags) for r in records_a]
    sums_b = [summarise_run(r, tags) for r in records_b]
    v: dict[str, Any] = {
        "workload": kind,
        "seed": seed,
        "n_boot": n_boot,
        "family_confidence": FAMILY_LEVEL,
        "per_metric_confidence": level,
        "headline": headline,
        "secondary": secondary,
        "costs": _costs(sums_a, sums_b),
        "caveats": _caveats(records_a + records_b)
        + (_probe_caveats({"A": sums_a, "B": sums_b}) if kind == "probe" else []),
        "plan": plan,
        "primary": plan.get("primary"),
        "runs_used": {"A": len(records_a), "B": len(records_b)},
        "excluded": list(excluded or []),
        "probe_plans": _probe_plans({"A": sums_a, "B": sums_b}),
    }
    for ex in v["excluded"]:
        v["caveats"].append(f"run {int(ex.get('idx', 0)) + 1} (arm {ex.get('arm')}) left out: {ex.get('reason')}")
    if len(records_a) < min_runs or len(records_b) < min_runs:
        v["call"] = INCONCLUSIVE
        v["inconclusive"] = (
            f"{len(records_a)} usable run(s) in A and {len(records_b)} in B; the verdict needs at least "
            f"{min_runs} completed runs per arm"
            + (f" ({len(v['excluded'])} left out as contaminated)" if v["excluded"] else "")
        )
        for row in headline:  # nothing is called from so few runs
            row["significant"], row["better"] = False, None
    else:
        v["call"] = _call(headline)
    v["summary"] = summary_text(v, profile_a, profile_b)
    return v


def _probe_plans(sums: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """How each arm's probe was sized (the first run's plan; the same server capacities every run)."""
    out = {}
    for arm, runs in sums.items():
        text = next((s.get("probe_plan") for s in runs if s.get("probe_plan")), None)
        if text:
            out[arm] = str(text)
    return out


def _mean(vals: list[Any]) -> float | None:
    xs = [float(x) for x in vals if isinstance(x, int | float)]
    return sum(xs) / len(xs) if xs else None


def _costs(sums_a: list[dict[str, Any]], sums_b: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm, sums in (("a", sums_a), ("b", sums_b)):
        out[f"pinned_bytes_{arm}"] = _mean([s.get("configured_offload_bytes") for s in sums])
        out[f"host_pinned_resident_bytes_{arm}"] = _mean([s.get("host_pinned_resident_bytes") for s in sums])
        out[f"store_bytes_{arm}"] = _mean([s.get("store_bytes") for s in sums])
        out[f"load_bytes_{arm}"] = _mean([s.get("load_bytes") for s in sums])
        for src in SOURCE_LABELS:
            out[f"share_{src}_{arm}"] = _mean([s.get(f"share_{src}") for s in sums])
    return out


def _caveats(records: list[dict[str, Any]]) -> list[str]:
    out = []
    if any(str(r.get("reset", "")).startswith("unavailable") for r in records):
        out.append(
            "caches could not be reset between runs (the server is not in dev mode); "
            "each profile switch restarted the server instead"
        )
    if any((r.get("counters") or {}).get("valid") is False for r in records):
        out.append("a counter went down during a run (server restart?): its counter deltas are left out")
    if any(r.get("timing_source") == "sim-model" for r in records):
        out.append(
            "simulated server (kvscope sim): TTFTs are its modeled times (x-kvscope-sim-ttft-ms), "
            "not the client's wall clock; their run-to-run spread is the sim's seeded noise "
            "(--sim-jitter; without it every run is identical and no interval has a width to call)"
        )
    elif any((r.get("server") or {}).get("simulated") for r in records):
        out.append("simulated server (kvscope sim): the timings come from its cost model")
    return out


def _probe_caveats(sums: dict[str, list[dict[str, Any]]]) -> list[str]:
    """A probe whose reload requests were served from the GPU pool measured nothing about offload."""
    out = []
    for arm, runs in sums.items():
        if (_mean([s.get("share_external_kv_transfer") for s in runs]) or 0) > 0:
            continue  # tokens came back from a tier: the probed prefix was evicted, and reloaded
        reload = _mean([s.get("ttft_reload_p50_ms") for s in runs])
        hit = _mean([s.get("ttft_hit_p50_ms") for s in runs])
        if reload is not None and hit is not None and reload <= 1.25 * hit:
            out.append(
                f"in arm {arm} the reload requests were about as fast as GPU hits ({reload:.1f} vs {hit:.1f} "
                "ms): the evicting prefixes probably did not evict the probed prefix; raise evict_prefixes "
                "or prefix_tokens"
            )
    return out


def _call(headline: list[dict[str, Any]]) -> str:
    better = {row["better"] for row in headline if row.get("significant")}
    if not better:
        return "no significant difference"
    if better == {"B"}:
        return "B is better"
    if better == {"A"}:
        return "A is better"
    return "mixed"


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "ratio":
        return f"{v * 100:.0f}%"
    if unit == "bytes":
        return f"{v / GIB:.2f} GiB"
    return f"{v:.3g} {unit}"


def describe(row: dict[str, Any]) -> str:
    """One metric in words: 'B cut TTFT p95 by 54% [49, 58] (77.0 ms -> 35.4 ms)'."""
    if not row.get("available"):
        return f"{row['label']}: not measured"
    a, b, unit = row["a"], row["b"], row["unit"]
    if not row["significant"]:
        return f"no significant difference in {row['label']} ({_fmt(a, unit)} vs {_fmt(b, unit)})"
    rel, lo, hi = row.get("rel"), row.get("rel_lo"), row.get("rel_hi")
    verb = "cut" if row["diff"] < 0 else "raised"
    if rel is not None and lo is not None and hi is not None:
        if row["diff"] < 0:
            pct, plo, phi = -rel * 100, -hi * 100, -lo * 100
        else:
            pct, plo, phi = rel * 100, lo * 100, hi * 100
        return f"B {verb} {row['label']} by {pct:.0f}% [{plo:.0f}, {phi:.0f}] ({_fmt(a, unit)} -> {_fmt(b, unit)})"
    return f"B {verb} {row['label']} from {_fmt(a, unit)} to {_fmt(b, unit)}"


def summary_text(v: dict[str, Any], profile_a: str, profile_b: str) -> str:
    parts = [f"A = {profile_a}, B = {profile_b}: {v['call']}."]
    sig = [describe(r) for r in v["headline"] if r.get("significant")]
    none = [r["label"] for r in v["headline"] if r.get("available") and not r.get("significant")]
    if v.get("inconclusive"):
        parts.append(v["inconclusive"] + "; observed, not a verdict:")
        seen = [
            f"{r['label']} {_fmt(r.get('a'), r['unit'])} (A) vs {_fmt(r.get('b'), r['unit'])} (B)"
            for r in v["headline"]
            if r.get("available")
        ]
        parts.append("; ".join(seen) + "." if seen else "nothing measured.")
        sig, none = [], []
    if sig:
        parts.append("; ".join(sig) + ".")
    if none:
        parts.append("No significant difference in " + ", ".join(none) + ".")
    c = v["costs"]
    pa, pb = c.get("pinned_bytes_a"), c.get("pinned_bytes_b")
    if isinstance(pa, int | float) and isinstance(pb, int | float) and pa != pb:
        more = pb - pa
        parts.append(f"Cost: {'B' if more > 0 else 'A'} pins {abs(more) / GIB:.2g} GiB more host RAM.")
    for arm in ("a", "b"):
        res = c.get(f"host_pinned_resident_bytes_{arm}")
        if isinstance(res, int | float) and res > 0:
            parts.append(f"Offload buffers resident on the host during {arm.upper()} runs: {res / GIB:.2g} GiB.")
    ea, eb = c.get("share_external_kv_transfer_a"), c.get("share_external_kv_transfer_b")
    if isinstance(ea, int | float) and isinstance(eb, int | float):
        parts.append(f"Prompt tokens reloaded from the offload tier: A {ea * 100:.0f}%, B {eb * 100:.0f}%.")
    conf = v["per_metric_confidence"]
    parts.append(
        f"(Intervals: hierarchical bootstrap widened for few runs (Student's t), {conf * 100:.2f}% per "
        f"metric so the {len(v['headline'])} headline metrics hold together at {v['family_confidence'] * 100:.0f}%; "
        f"runs used: A {v['runs_used']['A']}, B {v['runs_used']['B']}.)"
    )
    return " ".join(parts)
