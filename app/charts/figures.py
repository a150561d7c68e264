"""Plotly figures as plain JSON-able dicts (the plotly.js schema), built on the server.

x values are Unix milliseconds on a date axis; every y axis carries its unit; events are vertical
lines plus hoverable markers on a hidden axis; the figure is sized by the page, not here.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from app.charts import palette
from app.derived.panels import Panel, Trace
from app.storage.events import EventRow
from app.web.text import readable

EVENT_COLORS = palette.EVENTS
# a ceiling drawn as a line only when the data reach this share of it; below, a line at the
# ceiling would set the y axis and squash the data into a flat line at zero
CEILING_DRAWN_ABOVE = 0.5
SIG_DIGITS = 5  # y values sent to the page: 5 significant digits (a 600 px plot shows fewer)
DASH = {"line": "solid", "area": "solid", "dash": "dash", "dot": "dot"}
ROW_GAP = 0.08
MODEBAR_PX = 30  # top margin kept free for Plotly's modebar


def _clean(values: list[float | None]) -> list[float | None]:
    return [v if v is not None and math.isfinite(v) else None for v in values]


def plain(text: object) -> str:
    """Text for Plotly as text: it renders <a href>, <b>, <br> ... in trace names, legends,
    hover and annotations, so an agent's label `<a href="http://evil">x</a>` would be a live link.
    & and < become entities, which Plotly shows as the characters; a > alone opens nothing, so
    names such as "load CPU->GPU" stay as they are."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;")


_TEXT_KEYS = frozenset({"name", "text", "hovertext", "title"})


def _plain_texts(node: Any, key: str = "") -> Any:
    """Every string under a name / text / hovertext / title key of a figure, escaped (plain)."""
    if isinstance(node, dict):
        return {k: _plain_texts(v, k) for k, v in node.items()}
    if isinstance(node, list):
        if key in _TEXT_KEYS:
            return [_plain_texts(v, key) for v in node]
        # elsewhere only nested dicts / lists hold texts: a trace's 1,600 y values pass as they are
        return [_plain_texts(v, key) if isinstance(v, dict | list) else v for v in node]
    if isinstance(node, str) and key in _TEXT_KEYS:
        return plain(node)
    return node


def _axis_name(row: int) -> tuple[str, str]:
    """('y', 'yaxis') for row 0, ('y2', 'yaxis2') ..."""
    return ("y", "yaxis") if row == 0 else (f"y{row + 1}", f"yaxis{row + 1}")


def _trace(t: Trace, xs: list[int]) -> dict[str, Any]:
    yref, _ = _axis_name(t.row)
    tr: dict[str, Any] = {
        "type": "scatter",
        "mode": "lines",
        "name": t.name + (" (derived)" if t.derived and "derived" not in t.name else ""),  # escaped at the end
        "x": xs,
        "y": _clean(t.y),
        "yaxis": yref,
        "connectgaps": False,
        "line": {"width": 1.6, "dash": DASH.get(t.style, "solid")},
        "hovertemplate": f"%{{y:.4g}} {plain(t.unit)}<extra>{plain(t.name)}</extra>",
    }
    if t.color:
        tr["line"]["color"] = t.color
    if t.style == "area":
        tr["stackgroup"] = t.group or "stack"
        tr["line"]["width"] = 0.8
    return tr


MIN_SHOWN_S = 120.0  # a fresh instance's first two minutes still fill the width


def build_figure(panel: Panel, events: list[EventRow], data_since: float | None = None) -> dict[str, Any]:
    """data_since: when the instance's data begin; a range reaching further back is shown from
    there (a fresh demo fills the chart instead of sitting in a sliver at the right)."""
    g = panel.grid
    xs = [round(t * 1000) for t in g.times]
    shown_from = g.start
    if data_since is not None and math.isfinite(data_since) and data_since > g.start:
        shown_from = min(data_since, g.end - MIN_SHOWN_S) if g.end - g.start > MIN_SHOWN_S else g.start
        shown_from = max(shown_from, g.start)
    nrows = max(1, len(panel.rows))
    height = (1.0 - ROW_GAP * (nrows - 1)) / nrows
    layout: dict[str, Any] = {
        # the top margin is the modebar's alone (it used to cover the legend and the top of the
        # plot); the legend sits under the x-axis title, anchored to the figure's bottom edge
        "margin": {"l": 64, "r": 16, "t": MODEBAR_PX, "b": 8},
        "showlegend": True,
        "legend": {
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "y": 0,
            "yref": "container",
            "yanchor": "bottom",
            "font": {"size": 11},
        },
        "hovermode": "x unified",
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "xaxis": {
            "type": "date",
            "range": [int(shown_from * 1000), int(g.end * 1000)],
            "title": {"text": "time (UTC)", "standoff": 4},
            "automargin": True,
            "anchor": _axis_name(nrows - 1)[0],
        },
        "shapes": [],
        "annotations": [],
        "meta": {
            "key": panel.key,
            "tier": g.tier,
            "step_s": g.step,
            "points": len(xs),
            "rate_window_s": g.rate_window if g.tier == "raw" else g.step,
        },
    }
    for row, title in enumerate(panel.rows):
        top = 1.0 - row * (height + ROW_GAP)
        _, axis = _axis_name(row)
        ax: dict[str, Any] = {
            "title": {"text": title},
            "domain": [max(0.0, top - height), top],
            "rangemode": "tozero",
            "zeroline": True,
        }
        if row > 0:
            ax["anchor"] = "x"
        if row in panel.y_ranges:
            ax["range"] = list(panel.y_ranges[row])
        layout[axis] = ax
    data = [_trace(t, xs) for t in panel.traces]
    for row, y, label in panel.hlines:
        yref, _ = _axis_name(row)
        peak = max((v for t in panel.traces if t.row == row for v in _clean(t.y) if v is not None), default=0.0)
        if peak < CEILING_DRAWN_ABOVE * y:
            # the data stay at their own scale; the ceiling is said in words, with the peak's share of it
            share = f"peak here {peak:.3g} = {100 * peak / y:.2g} % of it" if y > 0 else ""
            layout["annotations"].append(
                {
                    "xref": "paper",
                    "x": 1,
                    "xanchor": "right",
                    "yref": "paper",
                    "y": 1,
                    "yanchor": "bottom",
                    "text": f"{label} (off scale; {share})" if share else label,
                    "showarrow": False,
                    "font": {"size": 10, "color": palette.CEILING},
                }
            )
            continue
        layout["shapes"].append(
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "yref": yref,
                "y0": y,
                "y1": y,
                "line": {"color": palette.CEILING, "width": 1.5, "dash": "dashdot"},
            }
        )
        layout["annotations"].append(
            {
                "xref": "paper",
                "x": 1,
                "xanchor": "right",
                "yref": yref,
                "y": y,
                "yanchor": "bottom",
                "text": label,
                "showarrow": False,
                "font": {"size": 10, "color": palette.CEILING},
            }
        )
    _add_events(layout, data, events, g.start, g.end)
    # labels come from agents: no HTML of theirs reaches Plotly (names, legends, hover, annotations)
    return {"data": _plain_texts(data), "layout": _plain_texts(layout)}


def _add_events(
    layout: dict[str, Any], data: list[dict[str, Any]], events: list[EventRow], start: float, end: float
) -> None:
    inside = [e for e in events if start <= float(e["ts"]) <= end]
    if not inside:
        return
    evx: list[int] = []
    texts: list[str] = []
    colors: list[str] = []
    for e in inside:
        x = round(float(e["ts"]) * 1000)
        color = EVENT_COLORS.get(str(e.get("kind")), palette.EVENT_OTHER)
        layout["shapes"].append(
            {
                "type": "line",
                "xref": "x",
                "x0": x,
                "x1": x,
                "yref": "paper",
                "y0": 0,
                "y1": 1,
                "line": {"color": color, "width": 1, "dash": "dot"},
            }
        )
        evx.append(x)
        texts.append(readable(f"{e.get('kind')}: {str(e.get('message', ''))[:200]}"))
        colors.append(color)
    layout["yaxis99"] = {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True}
    data.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "events",
            "x": evx,
            "y": [0.97] * len(evx),
            "yaxis": "y99",
            "marker": {"symbol": "triangle-down", "size": 9, "color": colors},
            "hovertext": texts,
            "hoverinfo": "text+x",
            "showlegend": False,
        }
    )


def compact(fig: dict[str, Any]) -> dict[str, Any]:
    """The figure as the page gets it: traces on the grid carry x0/dx instead of an x array (every
    trace shares the grid's instants) and y rounded to SIG_DIGITS significant digits, about a
    third of the bytes. The JSON API keeps full x arrays and full precision."""
    out = {"layout": fig["layout"], "data": []}
    for tr in fig["data"]:
        xs = tr.get("x")
        t = dict(tr)
        if isinstance(xs, list) and len(xs) >= 2:
            dx = xs[1] - xs[0]
            if all(b - a == dx for a, b in itertools.pairwise(xs)):
                del t["x"]
                t["x0"], t["dx"] = xs[0], dx
        if isinstance(tr.get("y"), list):
            t["y"] = [_round(v) for v in tr["y"]]
        out["data"].append(t)
    return out


def _round(v: Any, _floor: Any = math.floor, _log10: Any = math.log10) -> Any:
    # v - v is 0.0 for a finite float only (nan and inf give nan); the lookups bound as defaults:
    # this runs for every y value of every chart
    if not isinstance(v, float) or v == 0.0 or v - v != 0.0:
        return v
    return round(v, SIG_DIGITS - 1 - _floor(_log10(abs(v))))


SPARK_MARKERS_BELOW = 30  # fewer present points than this: draw markers too (a lone point shows)


def sparkline(xs: list[float], ys: list[float | None], unit: str, color: str) -> dict[str, Any]:
    """A small chart of the points that exist: the x range is the span of the present points (a
    few minutes of data fill the width instead of sitting at the edge of an hour), markers when
    there are few points, no x tick labels (the label above says the range), a tight y range."""
    clean = _clean(ys)
    present = [(x, y) for x, y in zip(xs, clean, strict=True) if y is not None]
    layout: dict[str, Any] = {
        "margin": {"l": 36, "r": 6, "t": 4, "b": 4},
        "showlegend": False,
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "xaxis": {"type": "date", "showgrid": False, "showticklabels": False, "ticks": "", "zeroline": False},
        "yaxis": {
            "title": {"text": unit, "font": {"size": 9}, "standoff": 2},
            "tickfont": {"size": 8},
            "nticks": 3,
            "zeroline": False,
        },
        "meta": {"points": len(present)},
    }
    if present:
        lo_x, hi_x = present[0][0], present[-1][0]
        if hi_x - lo_x < 60:  # one point or a few seconds: a minute around them
            lo_x, hi_x = lo_x - 30, hi_x + 30
        pad_x = (hi_x - lo_x) * 0.03  # the end markers are not cut in half by the plot edge
        layout["xaxis"]["range"] = [round((lo_x - pad_x) * 1000), round((hi_x + pad_x) * 1000)]
        lo_y = min(y for _, y in present)
        hi_y = max(y for _, y in present)
        pad = (hi_y - lo_y) * 0.1 or max(abs(hi_y) * 0.05, 0.5)
        layout["yaxis"]["range"] = [lo_y - pad, hi_y + pad]
    mode = "lines+markers" if len(present) < SPARK_MARKERS_BELOW else "lines"
    return {
        "data": [
            {
                "type": "scatter",
                "mode": mode,
                "x": [round(t * 1000) for t in xs],
                "y": clean,
                "line": {"width": 1.4, "color": color},
                "marker": {"size": 5, "color": color},
                "hovertemplate": f"%{{x|%H:%M:%S}} UTC: %{{y:.3g}} {plain(unit)}<extra></extra>",
                "connectgaps": False,
            }
        ],
        "layout": layout,
    }
