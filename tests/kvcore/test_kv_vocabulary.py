"""One KV vocabulary (kvcore/kv_vocabulary.py): the same window computed through every consumer of
the hit rates gives the same numbers. Consumers: the summary (database increases), the alert
rules (window increases), the Prometheus exporter (rates), the A/B workload snapshots (two
/metrics texts), the instance hit-rate chart and the overview sparkline (rates on a grid).

The window covers the same scrapes for all: it starts between scrape FIRST-1 and FIRST (increase-based
consumers count from scrape FIRST-1, the last before it) and the rate-based ones get a rate window
reaching back just past scrape i-1. Data: the recorded workload of tests/app/dashboard/recorded.py,
made up by that generator. Variants drop vLLM's own totals so every consumer takes the same
fallback (prompt_tokens_by_source).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest

from agent.workloads.snapshot import delta, parse_snapshot
from app.alerts.hitrates import hit_rate
from app.alerts.series import SeriesMap
from app.derived.fleet import sparklines
from app.derived.grid import Grid
from app.derived.instance_charts import hit_rates as hit_rate_chart
from app.derived.panels import make_scope
from app.derived.series_reader import TieredSeries
from app.derived.summary import compute_summary
from app.export.exporter import derive
from app.ingest.parse import parse_batch
from app.storage.ingest_store import IngestWriter
from app.storage.series_store import list_instances
from kvcore import kv_vocabulary as kv
from kvcore.series import indexed
from tests.app.dashboard.recorded import TYPES, recorded_batches

T0 = 1_800_000_000.0
FIRST, LAST = 20, 70  # the window holds scrapes FIRST-1 (its base) .. LAST

Points = dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]]


def _batches(drop: tuple[str, ...]) -> list[dict[str, Any]]:
    batches = recorded_batches(T0, 90, interval=5.0)
    for b in batches:
        sc = b["scrapes"][0]
        sc["samples"] = [s for s in sc["samples"] if s["name"] not in drop]
    return batches


def _points(batches: list[dict[str, Any]]) -> Points:
    out: Points = defaultdict(list)
    for b in batches:
        sc = b["scrapes"][0]
        for s in sc["samples"]:
            out[(s["name"], tuple(sorted(s["labels"].items())))].append((sc["ts"], float(s["value"])))
    return out


def _exposition(batch: dict[str, Any]) -> str:
    lines = [f"# TYPE {fam} {t}" for fam, t in TYPES.items()]
    for s in batch["scrapes"][0]["samples"]:
        labels = ",".join(f'{k}="{v}"' for k, v in s["labels"].items())
        lines.append(f"{s['name']}{{{labels}}} {s['value']!r}")
    return "\n".join(lines) + "\n"


class _GridScope:
    """The fetch interface the chart and the sparkline read, over the recorded raw points."""

    def __init__(self, pts: Points, grid: Grid) -> None:
        self.pts, self.grid = pts, grid
        self.instance: dict[str, Any] = {"cache_config": {}, "offload_config": {}}
        self.state = "up"

    def fetch(self, names: list[str], host: bool = False) -> dict[str, list[TieredSeries]]:
        out: dict[str, list[TieredSeries]] = {n: [] for n in names}
        for (name, labels), p in self.pts.items():
            if name in out:
                out[name].append(TieredSeries(1, name, dict(labels), "counter", "raw", 0.0, p, []))
        return out

    fetch_counters = fetch


def _by_consumer(engine: Any, batches: list[dict[str, Any]]) -> dict[str, tuple[float | None, ...]]:
    ts = [b["scrapes"][0]["ts"] for b in batches]
    start = ts[FIRST - 1] + 0.4 * (ts[FIRST] - ts[FIRST - 1])
    end = ts[LAST] + 0.01
    rate_w = end - (ts[FIRST - 1] - 0.01)
    pts = _points(batches)
    out: dict[str, tuple[float | None, ...]] = {}

    # summary: the database's increases from the last sample before start
    writer = IngestWriter(engine)
    for b in batches:
        writer.write(parse_batch(json.dumps(b).encode(), b["sent_at"], max_future_skew_s=300, max_past_age_s=1e9), 0)
    inst = list_instances(engine)[0]
    sc = make_scope(engine, inst, start=start, end=end, now=end + 5, state="up", raw_retention_s=1e9)
    s = compute_summary(sc).hit_rate
    out["summary"] = (s.gpu, s.offload, s.overall)

    # alert rules: window increases anchored on the last point at or before start
    by_name: dict[str, list[Any]] = defaultdict(list)
    for (name, labels), p in pts.items():
        by_name[name].append(indexed(dict(labels), p))
    series = SeriesMap(dict(by_name))
    out["alerts"] = tuple(hit_rate(series, tier, start, end).rate for tier in ("gpu", "offload", "overall"))

    # exporter: rates over (now - window, now]
    ws = [
        TieredSeries(i, name, dict(labels), "counter", "raw", 0.0, p, [], host_id=1, instance_id=1)
        for i, ((name, labels), p) in enumerate(pts.items())
        if name.endswith("_total")
    ]
    inst_row = {**inst, "host": "rig1", "host_last_push": end, "last_ok": end, "last_scrape": end, "healthy": True}
    got = {
        name: v
        for name, labels, v in derive([inst_row], ws, end, rate_w, stale_after=1e9)
        if labels.get("instance_id") == str(inst["id"]) and name.endswith("hit_ratio")
    }
    out["exporter"] = (
        got.get("instance_gpu_prefix_cache_hit_ratio"),
        got.get("instance_offload_hit_ratio"),
        got.get("instance_prompt_cache_hit_ratio"),
    )

    # A/B workload snapshots: /metrics before (scrape FIRST-1) and after (scrape LAST)
    d = delta(parse_snapshot(_exposition(batches[FIRST - 1])), parse_snapshot(_exposition(batches[LAST])), end - start)
    out["snapshot"] = (d["gpu_hit_rate"], d["external_hit_rate"], d["overall_hit_rate"])

    # instance chart and overview sparkline: one instant at `end`, rate window back past scrape FIRST-1
    grid = Grid(start, end, rate_w, "raw", [end])
    chart = {t.name: t.y[0] for t in hit_rate_chart(_GridScope(pts, grid)).traces}  # type: ignore[arg-type]

    def pct(v: float | None) -> float | None:
        return None if v is None else v / 100.0

    out["chart"] = (
        pct(chart.get(kv.HIT_GPU.label)),
        pct(chart.get(kv.HIT_OFFLOAD.label)),
        pct(chart.get(kv.HIT_OVERALL.label)),
    )
    spark = sparklines(_GridScope(pts, grid))  # type: ignore[arg-type]
    out["overview"] = (None, None, pct(spark["hit"][0]) if "hit" in spark else None)
    return out


@pytest.mark.parametrize(
    "drop",
    [
        (),
        (kv.CACHED,),  # numerator falls back to by_source's cached sources
        (kv.CACHED, kv.PROMPT_TOKENS),  # and the denominator to the sum of by_source
    ],
    ids=["vllm-totals", "no-cached-total", "by-source-only"],
)
def test_every_consumer_computes_the_same_hit_rates_for_one_window(engine: Any, drop: tuple[str, ...]) -> None:
    batches = _batches(drop)
    got = _by_consumer(engine, batches)
    ref = got["summary"]
    assert all(v is not None and 0 < v < 1 for v in ref), ref
    for consumer, rates in got.items():
        for key, want, have in zip(("gpu", "offload", "overall"), ref, rates, strict=True):
            if consumer == "overview" and key != "overall":
                continue  # the sparkline shows the overall rate only
            assert have == pytest.approx(want, rel=1e-12), (consumer, key, have, want)


def test_sources_and_hit_rates_have_one_colour_and_label_each() -> None:
    colours = [s.color for s in kv.SOURCES]
    assert len(set(colours)) == len(colours)
    assert kv.HIT_GPU.color == kv.GPU_HIT.color and kv.HIT_OFFLOAD.color == kv.OFFLOAD_RELOAD.color
    assert kv.source_label("external_kv_transfer", "disk") == "disk reload"
    assert kv.source_label("external_kv_transfer") == "offload reload"
    assert kv.source_label("something_new") == "something_new" and kv.source_color("something_new") is None


def test_offload_tiers_are_named_by_what_they_are() -> None:
    cpu = {"kv_offloading_size": "4", "kv_offloading_backend": "native"}
    assert kv.offload_tiers(cpu) == ["CPU"]
    assert kv.offload_tiers({"kv_offloading_size": "2", "kv_offloading_backend": "lmcache"}) == ["LMCache"]
    assert kv.offload_tiers({"kv_offloading_size": "None"}, cached_sources=["device", "external_unspecified"]) == [
        "external connector"
    ]
    assert kv.offload_tiers(cpu, tiering_tiers=["0:primary", "1:fs"]) == ["CPU", "disk"]
    assert kv.offload_tiers(cpu, cached_sources=["host", "disk", "p2p"]) == ["CPU", "disk", "peer instance (p2p)"]
    assert kv.offload_tiers({"kv_offloading_size": "garbage"}) == [] and kv.offload_tiers(None) == []
    assert kv.tier_name([]) is None and kv.tier_name(["CPU", "disk"]) == "CPU + disk"
    # a known connector names what vLLM reports only as external_unspecified
    off = {"kv_offloading_size": "None"}
    assert kv.offload_tiers(off, cached_sources=["external_unspecified"], connector="ExampleConnector") == ["disk"]
    assert kv.offload_tiers(off, connector="SomeNewConnector") == ["SomeNewConnector"]
    argv = ["serve", "m", "--kv-transfer-config", '{"kv_connector": "ExampleConnector", "kv_role": "kv_both"}']
    assert kv.connector_from_argv(argv) == "ExampleConnector"
    assert kv.connector_from_argv(['--kv-transfer-config={"kv_connector":"LMCacheConnectorV1"}']) == (
        "LMCacheConnectorV1"
    )
    assert kv.connector_from_argv(["--kv-transfer-config", "{not json"]) is None
    assert kv.connector_from_argv(["--kv-transfer-config", "[1]"]) is None and kv.connector_from_argv([]) is None
