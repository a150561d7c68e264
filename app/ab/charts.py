"""Plotly figures of an experiment, as plain JSON-able dicts (plotly.js draws them in the page)."""

from __future__ import annotations

from typing import Any

from app.ab.results import SOURCE_LABELS, SOURCES, request_values
from app.ab.verdict import focus_tags, headline_metrics
from app.charts import palette
from app.storage.ab_rows import RunRow
from kvcore import kv_vocabulary as kv

ARM_COLORS = palette.ARMS
# headline metric key -> the per-run summary key that shows it run by run
RUN_KEYS = {
    "ttft_p50": "focus_ttft_p50_ms",
    "ttft_p95": "focus_ttft_p95_ms",
    "ttft_p99": "focus_ttft_p99_ms",
    "itl_mean": "itl_mean_ms",
}


def _layout(title: str, xtitle: str, ytitle: str) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 14}, "x": 0.01, "xanchor": "left"},
        "height": 280,
        "margin": {"l": 55, "r": 10, "t": 45, "b": 40},
        "xaxis": {"title": {"text": xtitle}},
        "yaxis": {"title": {"text": ytitle}, "rangemode": "tozero"},
        "legend": {"orientation": "h"},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
    }


def per_run_figures(kind: str, runs: list[RunRow]) -> list[dict[str, Any]]:
    figs = []
    done = [r for r in runs if r.get("summary")]
    for m in headline_metrics(kind):
        key = RUN_KEYS.get(m.key, m.key)
        traces = []
        for arm in ("A", "B"):
            pts = [(r["idx"] + 1, r["summary"].get(key)) for r in done if r["arm"] == arm]
            pts = [(x, y) for x, y in pts if isinstance(y, int | float)]
            traces.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": f"arm {arm}",
                    "x": [p[0] for p in pts],
                    "y": [p[1] for p in pts],
                    "marker": {"size": 10, "color": ARM_COLORS[arm]},
                }
            )
        figs.append({"id": f"run-{m.key}", "data": traces, "layout": _layout(f"{m.label} per run", "run", m.unit)})
    return figs


def ttft_cdf_figure(kind: str, runs: list[RunRow]) -> dict[str, Any]:
    tags = focus_tags(kind)
    traces = []
    modeled = any((r.get("record") or {}).get("timing_source") == "sim-model" for r in runs)
    for arm in ("A", "B"):
        vals: list[float] = []
        for r in runs:
            if r["arm"] == arm and r.get("state") == "done":
                vals.extend(request_values(r.get("record") or {}, "ttft_s", tags))
        vals.sort()
        n = len(vals)
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "line": {"shape": "hv", "color": ARM_COLORS[arm]},
                "name": f"arm {arm} (n={n})",
                "x": vals,
                "y": [(i + 1) / n for i in range(n)],
            }
        )
    what = " of the reload requests" if tags else ""
    how = "the sim's modeled TTFT" if modeled else "client-side"
    return {"id": "ttft-cdf", "data": traces, "layout": _layout(f"TTFT CDF{what} ({how})", "ms", "fraction")}


def source_share_figure(runs: list[RunRow]) -> dict[str, Any]:
    done = [r for r in runs if r.get("summary")]
    x = [f"{r['idx'] + 1}{r['arm']}" for r in done]
    traces = [
        {
            "type": "bar",
            "name": SOURCE_LABELS[s],
            "x": x,
            "marker": {"color": kv.source_color(s)},
            "y": [r["summary"].get(f"share_{s}") for r in done],
        }
        for s in SOURCES
    ]
    layout = _layout("Prompt tokens by source, per run", "run and arm", "share")
    layout["barmode"] = "stack"
    return {"id": "sources", "data": traces, "layout": layout}


def experiment_figures(kind: str, runs: list[RunRow]) -> list[dict[str, Any]]:
    figs = per_run_figures(kind, runs)
    if kind != "observe":
        figs.append(ttft_cdf_figure(kind, runs))
    figs.append(source_share_figure(runs))
    return figs
