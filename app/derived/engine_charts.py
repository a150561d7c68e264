"""Engine and tier names on the instance charts, for endpoints read by an engine reader
(agent/engines: SGLang, TensorRT-LLM, Dynamo KVBM, vLLM + LMCache, vLLM's tiers).

The charts of app/derived/instance_charts.py read the dashboard's vocabulary, which the engine
readers also write (labelled ``kv_engine``). This module wraps each chart:
- the title names the engine (from ``kvscope:kv_engine_info``; nothing for plain vLLM);
- tokens: the offload reload is split per tier when the series say which tier (SGLang: CPU and
  storage; TensorRT-LLM: host and disk);
- hit rates: each tier's own rate (ratio of the increases of ``kvscope:kv_tier_hit_*`` and
  ``_lookup_*``, the engine's definition in the legend) and the rates the engine reports itself
  (dotted, "as reported");
- transfer: tier-to-tier traffic beyond GPU <-> CPU (CPU -> disk, storage -> CPU, LMCache's
  remote backend ...), in GB/s, tokens/s or blocks/s, as the engine counts it;
- pinned: the engine's own pinned-memory reading (TensorRT-LLM);
- tiers: each tier's occupancy (used / capacity, or the engine's own ratio) and, where only bytes
  are known (LMCache), the bytes held.
Block-converted series say so in their legend.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from agent.engines import ENGINES
from agent.engines import kv_series as ks
from app.charts import palette
from app.derived.grid_math import counter_rate, gauge_values, scale, total
from app.derived.panels import Panel, Scope, Trace
from app.derived.series_reader import TieredSeries
from kvcore import kv_vocabulary as kv
from kvcore.series import ratio

GIB = float(2**30)
# GPU <-> CPU traffic is drawn by the chart from vLLM's families (the readers write both)
_DRAWN_PATHS = frozenset({"CPU->GPU", "GPU->CPU"})
Chart = Callable[[Scope], Panel]


def engine_title(scope: Scope) -> str | None:
    """ "SGLang", "vLLM + LMCache" ...: the newest engine info of the instance; None when none."""
    best: tuple[float, dict[str, str]] | None = None
    for s in scope.fetch([ks.ENGINE_INFO])[ks.ENGINE_INFO]:
        seen = s.points[-1][0] if s.points else (s.buckets[-1].ts if s.buckets else 0.0)
        if best is None or seen > best[0]:
            best = (seen, s.labels)
    if best is None:
        return None
    labels = best[1]
    name = labels.get("engine") or labels.get("kv_engine") or ""
    comps = labels.get("components", "")
    return " + ".join(x for x in (name, comps.replace(",", " + ")) if x) or None


def _color(i: int) -> str:
    return palette.OTHER_SOURCE_COLORS[i % len(palette.OTHER_SOURCE_COLORS)]


def _groups(series: list[TieredSeries], *keys: str) -> dict[tuple[str, ...], list[TieredSeries]]:
    out: dict[tuple[str, ...], list[TieredSeries]] = {}
    for s in series:
        out.setdefault(tuple(s.labels.get(k, "") for k in keys), []).append(s)
    return out


def _converted(s: TieredSeries) -> str:
    bs = s.labels.get("block_size")
    return f", from blocks of {bs} tokens" if s.labels.get("converted") == "blocks" and bs else ""


def _reveal(p: Panel) -> None:
    if p.has_data():
        p.empty = None


# ----------------------------------------------------------------------------- per chart
def _tokens(p: Panel, scope: Scope) -> None:
    ext = [s for s in scope.fetch([kv.BY_SOURCE])[kv.BY_SOURCE] if s.labels.get("source") == "external_kv_transfer"]
    by_tier = _groups(ext, "tier")
    if len(by_tier) < 2 or ("",) in by_tier:
        return  # one tier (or unnamed ones): the chart's own trace already says it
    reload = [t for t in p.traces if t.group == "src" and t.color == kv.OFFLOAD_RELOAD.color]
    if len(reload) != 1:
        return
    at = p.traces.index(reload[0])
    split = []
    for i, ((tier,), series) in enumerate(sorted(by_tier.items())):
        vals = total(series, scope.grid, counter_rate)
        if vals is not None:
            color = kv.OFFLOAD_RELOAD.color if i == 0 else _color(i)
            split.append(
                Trace(
                    kv.source_label("external_kv_transfer", tier),
                    vals,
                    "tokens/s",
                    style="area",
                    color=color,
                    group="src",
                )
            )
    p.traces[at : at + 1] = split


def _hit_rates(p: Panel, scope: Scope) -> None:
    g = scope.grid
    names = [ks.TIER_HIT_TOKENS, ks.TIER_LOOKUP_TOKENS, ks.TIER_HIT_BLOCKS, ks.TIER_LOOKUP_BLOCKS, ks.ENGINE_HIT_RATE]
    got = scope.fetch(names)
    i = 0
    for hits_name, looks_name, unit in (
        (ks.TIER_HIT_TOKENS, ks.TIER_LOOKUP_TOKENS, "tokens"),
        (ks.TIER_HIT_BLOCKS, ks.TIER_LOOKUP_BLOCKS, "blocks"),
    ):
        hits = _groups(got[hits_name], "kv_engine", "tier", "definition")
        looks = _groups(got[looks_name], "kv_engine", "tier", "definition")
        for key in sorted(hits.keys() & looks.keys()):
            h, q = total(hits[key], g, counter_rate), total(looks[key], g, counter_rate)
            if h is None or q is None:
                continue
            _engine, tier, definition = key
            name = f"{tier} tier ({definition}{_converted(hits[key][0])})" if definition else f"{tier} tier"
            if unit == "blocks":
                name += ", counted in blocks"
            p.traces.append(Trace(name, ratio(h, q, 100.0), "%", color=_color(i)))
            i += 1
    for (engine, tier, definition), series in sorted(
        _groups(got[ks.ENGINE_HIT_RATE], "kv_engine", "tier", "definition").items()
    ):
        vals = total(series, g, gauge_values)
        if vals is not None:
            shown = ENGINES[engine].title if engine in ENGINES else engine
            p.traces.append(
                Trace(
                    f"{shown} as reported: {tier} ({definition})",
                    scale(vals, 100.0),
                    "%",
                    style="dot",
                    color=_color(i),
                )
            )
            i += 1
    if i:
        p.notes.append(
            "Per-tier rates use each engine's own definition (in the legend); dotted: as the engine reports."
        )
        _reveal(p)


def _transfer(p: Panel, scope: Scope) -> None:
    g = scope.grid
    got = scope.fetch([ks.TIER_TRANSFER_BYTES, ks.TIER_TRANSFER_TOKENS, ks.TIER_TRANSFER_BLOCKS])
    i = 0
    for name, unit, k in (
        (ks.TIER_TRANSFER_BYTES, "GB/s", 1e-9),
        (ks.TIER_TRANSFER_TOKENS, "tokens/s", 1.0),
        (ks.TIER_TRANSFER_BLOCKS, "blocks/s", 1.0),
    ):
        groups = _groups(got[name], "kv_engine", "direction", "path")
        if name == ks.TIER_TRANSFER_BYTES and p.has_data():  # vLLM's families drew GPU <-> CPU already
            groups = {key: v for key, v in groups.items() if key[2] not in _DRAWN_PATHS}
        if not groups:
            continue
        row = p.rows.index(unit) if unit in p.rows else len(p.rows)
        if row == len(p.rows):
            p.rows.append(unit)
        for (_engine, direction, path), series in sorted(groups.items()):
            vals = total(series, g, counter_rate)
            if vals is not None:
                label = f"{direction} {path}" + ("" if unit == "GB/s" else f" ({unit}{_converted(series[0])})")
                p.traces.append(Trace(label, scale(vals, k), unit, row=row, color=_color(i)))
                i += 1
    if i:
        p.notes.append("Tier-to-tier traffic as each engine counts it (bytes, tokens or blocks).")
        _reveal(p)


def _tiers(p: Panel, scope: Scope) -> None:
    g = scope.grid
    names = [ks.TIER_USED_TOKENS, ks.TIER_CAPACITY_TOKENS, ks.TIER_USAGE_RATIO, ks.TIER_USED_BYTES]
    got = scope.fetch(names)
    used = _groups(got[ks.TIER_USED_TOKENS], "kv_engine", "tier")
    cap = _groups(got[ks.TIER_CAPACITY_TOKENS], "kv_engine", "tier")
    i = 0
    for key in sorted(used.keys() & cap.keys()):
        u, c = total(used[key], g, gauge_values), total(cap[key], g, gauge_values)
        if u is None or c is None:
            continue
        note = " incl. cached prefix" if key[1] == ks.GPU else ""
        p.traces.append(
            Trace(f"{key[1]} tier resident{note}{_converted(used[key][0])}", ratio(u, c, 100.0), "%", color=_color(i))
        )
        i += 1
    for (_engine, tier), series in sorted(_groups(got[ks.TIER_USAGE_RATIO], "kv_engine", "tier").items()):
        vals = total(series, g, gauge_values)
        if vals is not None:
            p.traces.append(Trace(f"{tier} tier usage (engine's ratio)", scale(vals, 100.0), "%", color=_color(i)))
            i += 1
    held = _groups(got[ks.TIER_USED_BYTES], "kv_engine", "tier")
    if held:
        row = len(p.rows)
        p.rows.append("GiB held")
        for (_engine, tier), series in sorted(held.items()):
            held_vals = total(series, g, gauge_values)
            if held_vals is not None:
                p.traces.append(Trace(f"{tier} held", scale(held_vals, 1 / GIB), "GiB", row=row, color=_color(i)))
                i += 1
    if i:
        _reveal(p)


def _pinned(p: Panel, scope: Scope) -> None:
    for i, ((engine,), series) in enumerate(
        sorted(_groups(scope.fetch([ks.ENGINE_PINNED_BYTES])[ks.ENGINE_PINNED_BYTES], "kv_engine").items())
    ):
        vals = total(series, scope.grid, gauge_values)
        if vals is not None:
            shown = ENGINES[engine].title if engine in ENGINES else engine
            p.traces.append(Trace(f"{shown} pinned memory (as reported)", scale(vals, 1 / GIB), "GiB", color=_color(i)))
    _reveal(p)


ADDITIONS: dict[str, Callable[[Panel, Scope], None]] = {
    "pinned": _pinned,
    "tokens": _tokens,
    "hitrates": _hit_rates,
    "transfer": _transfer,
    "tiers": _tiers,
}


def named(key: str, chart: Chart) -> Chart:
    """The chart, with the engine in its title and the tiers' own series added."""

    @wraps(chart)
    def with_names(scope: Scope) -> Panel:
        p = chart(scope)
        title = engine_title(scope)
        if title is None:
            return p
        p.title = f"{p.title} · {title}"
        add = ADDITIONS.get(key)
        if add is not None:
            add(p, scope)
        return p

    return with_names


def with_engine_names(charts: dict[str, Chart]) -> dict[str, Chart]:
    return {key: named(key, chart) for key, chart in charts.items()}
