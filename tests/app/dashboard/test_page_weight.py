"""Readable, light pages: grids of at most 600 points that follow the plot's width, Grafana's
rate window, compact embedded figures, gzip, the vendored plotly.js partial bundle, a ceiling
that does not flatten the data, a default range that fits the data, HTML error pages, no None."""

from __future__ import annotations

import gzip
import json
import re
from typing import Any

import pytest

from app.charts.figures import build_figure, compact
from app.dashboard.instance import merge_restarts, plot_px
from app.derived.grid import MAX_POINTS, MIN_RATE_WINDOW_S, make_grid, rate_interval
from app.derived.panels import Panel, Trace
from app.web.ranges import RANGES, default_range
from app.web.text import readable
from tests.app.dashboard.recorded import fed_app, recorded_batches

T0 = 1_800_000_000.0
CHARTS = ["tokens", "hitrates", "transfer", "pinned", "tiers", "latency", "gpu"]


@pytest.fixture(scope="module")
def client(tmp_path_factory: Any) -> Any:
    batches = recorded_batches(T0 - 1800, 300, interval=5.0, simulated=True)
    with fed_app(tmp_path_factory.mktemp("weight"), batches, T0) as (_app, c, _clock):
        yield c


def test_rate_window_is_grafanas_rate_interval() -> None:
    assert rate_interval(1.0, 5.0) == 20.0  # four scrapes when the step is short
    assert rate_interval(60.0, 5.0) == 65.0  # step + one scrape when the step is long
    assert rate_interval(10.0, None) == 10.0
    g = make_grid(T0 - 900, T0, "raw", 600, scrape_gap=5.0)
    assert g.rate_window == MIN_RATE_WINDOW_S and g.step == 2.0  # never under 30 s on raw samples
    assert make_grid(T0 - 86400, T0, "raw", 600, scrape_gap=15.0).rate_window == 145.0 + 15.0  # step + scrape


@pytest.mark.parametrize("span", [300.0, 900.0, 3600.0, 6 * 3600.0, 86400.0, 30 * 86400.0])
@pytest.mark.parametrize("px", [None, 200, 390, 1600, 4000])
def test_no_trace_has_more_than_600_points_whatever_the_range_or_width(span: float, px: int | None) -> None:
    for tier in ("raw", "1m", "1h"):
        g = make_grid(T0 - span, T0, tier, px)
        assert len(g.times) <= min(MAX_POINTS, px or MAX_POINTS)


def test_chart_api_and_fragments_follow_the_plot_width(client: Any) -> None:
    for key in CHARTS:
        body = client.get(f"/api/v1/instances/1/charts/{key}?range=15m&px=4000").json()
        assert body["points"] <= MAX_POINTS
    narrow = client.get("/api/v1/instances/1/charts/tokens?range=15m&px=300").json()
    assert narrow["points"] <= 300
    frag = client.get("/instances/1/fragments/chart/tokens?range=15m&px=310").text
    (fig,) = re.findall(r'<script type="application/json" id="fig-tokens">(.*?)</script>', frag, re.S)
    data = json.loads(fig)["data"]
    assert all("x" not in t and t["dx"] > 0 for t in data if t.get("name") != "events")
    assert max(len(t["y"]) for t in data) <= plot_px(310) == 300
    assert client.get("/instances/1/fragments/chart/tokens?range=15m&px=0").status_code == 422  # an HTML error


def test_page_embeds_compact_figures_that_keep_the_values(client: Any) -> None:
    body = client.get("/api/v1/instances/1/charts/tokens?range=15m").json()
    fig = body["figure"]
    small = compact(fig)
    for full, c in zip(fig["data"], small["data"], strict=True):
        if "x0" in c:
            assert c["x0"] + c["dx"] * (len(full["x"]) - 1) == full["x"][-1]
        for a, b in zip(full["y"], c["y"], strict=True):
            assert (a is None and b is None) or b == pytest.approx(a, rel=1e-4, abs=1e-9)
    assert len(json.dumps(small)) < 0.6 * len(json.dumps(fig))


def test_every_text_response_is_gzipped(client: Any) -> None:
    for path in ("/instances/1", "/instances/1/fragments/chart/latency?range=15m", "/static/js/dashboard.js", "/"):
        r = client.get(path, headers={"Accept-Encoding": "gzip"})
        assert r.status_code == 200 and r.headers.get("content-encoding") == "gzip", path


def test_plotly_is_the_vendored_cartesian_bundle_and_the_page_weighs_little(client: Any) -> None:
    page = client.get("/instances/1").text
    assert "/static/vendor/plotly-cartesian-4.1.1.min.js" in page and "plotly.min.js" not in page
    js = client.get("/static/vendor/plotly-cartesian-4.1.1.min.js")
    assert js.status_code == 200 and len(js.content) < 1_600_000
    assert len(gzip.compress(js.content)) < 600_000  # what the wire carries
    assert len(gzip.compress(page.encode())) < 400_000


def _panel(y: list[float | None], ceiling: float) -> Panel:
    g = make_grid(T0 - 300, T0, "raw", 600)
    p = Panel("transfer", "KV transfer", g, ["GB/s"])
    p.traces.append(Trace("load", y + [None] * (len(g.times) - len(y)), "GB/s"))
    p.hlines.append((0, ceiling, "PCIe gen4 x16 ceiling 31.5 GB/s"))
    return p


def test_a_far_ceiling_is_said_in_words_and_does_not_flatten_the_data() -> None:
    far = build_figure(_panel([0.1, 0.3, 0.2], 31.5), [])
    assert not far["layout"]["shapes"]  # no line at 31.5: the y axis stays at the data's scale
    (note,) = far["layout"]["annotations"]
    assert "off scale" in note["text"] and "peak here 0.3" in note["text"]
    near = build_figure(_panel([20.0, 25.0], 31.5), [])
    assert near["layout"]["shapes"][0]["y0"] == 31.5


def test_a_fresh_instance_opens_on_a_range_that_fits_its_data() -> None:
    assert default_range(T0, T0 - 120) == "5m"
    assert default_range(T0, T0 - 600) == "15m"
    assert default_range(T0, T0 - 40 * 60) == "1h"
    assert default_range(T0, T0 - 5 * 86400) == "1h"
    assert default_range(T0, None) == "1h" and default_range(T0, "garbage") == "1h"
    assert all(RANGES[a] < RANGES[b] for a, b in zip(list(RANGES), list(RANGES)[1:], strict=False))
    fig = build_figure(_panel([1.0], 100.0), [], data_since=T0 - 200)
    lo, hi = fig["layout"]["xaxis"]["range"]
    assert (hi - lo) / 1000 == pytest.approx(200, abs=1)


@pytest.mark.parametrize("path", ["/instances/abc", "/instances/99", "/instances/%3Cscript%3Ealert(1)"])
def test_unknown_or_malformed_instance_urls_answer_an_escaped_html_page(client: Any, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert "<script>alert" not in r.text and "Back to the overview" in r.text
    bad = client.get("/instances/1?range=custom&start=abc&end=1")
    assert bad.status_code == 422 and "Unix time" in bad.text and bad.headers["content-type"].startswith("text/html")
    assert "&#39;abc&#39;" in bad.text  # the rejected value is quoted back, escaped
    backwards = client.get("/instances/1?range=custom&start=100&end=50")
    assert backwards.status_code == 400 and backwards.headers["content-type"].startswith("text/html")


def test_one_restart_draws_one_annotation() -> None:
    events = [
        {"ts": 100.0, "kind": "restart", "instance_id": 1, "message": "vLLM restarted"},
        {"ts": 104.0, "kind": "counter_reset", "instance_id": 1, "message": "3 counter(s) went down"},
        {"ts": 900.0, "kind": "counter_reset", "instance_id": 1, "message": "an unexplained reset"},
    ]
    assert [e["ts"] for e in merge_restarts(events)] == [100.0, 900.0]


def test_python_none_never_reaches_the_screen() -> None:
    assert readable("cache config changed: kv_offloading_size 2.0 -> None") == (
        "cache config changed: kv_offloading_size 2.0 -> not set"
    )
    assert readable("ratio nan") == "ratio n/a" and readable("Nonesuch") == "Nonesuch"


def test_the_gpu_panel_shows_only_the_gpus_the_agent_matched_to_the_instance(tmp_path: Any) -> None:
    batches = recorded_batches(T0 - 600, 60, interval=5.0, simulated=True)
    for b in batches:  # a second GPU on the host, used by another instance
        b["host_samples"] += [
            {**s, "labels": {**s["labels"], "gpu": "1"}} for s in b["host_samples"] if s["labels"].get("gpu") == "0"
        ]
    with fed_app(tmp_path / "both", batches, T0) as (_app, c, _clock):
        both = c.get("/api/v1/instances/1/charts/gpu?range=15m").json()
        assert {t["name"].split()[0] for t in both["figure"]["data"]} == {"GPU0", "GPU1"}
        assert any("Every GPU of the host" in n for n in both["notes"])
    for b in batches:
        b["scrapes"][0]["samples"].append({"name": "kvscope:instance_gpu", "labels": {"gpu": "1"}, "value": 1.0})
        b["scrapes"][0]["types"]["kvscope:instance_gpu"] = "gauge"
    with fed_app(tmp_path / "mine", batches, T0) as (_app, c, _clock):
        mine = c.get("/api/v1/instances/1/charts/gpu?range=15m").json()
        assert {t["name"].split()[0] for t in mine["figure"]["data"]} == {"GPU1"}
        assert any("GPU 1 of this host" in n for n in mine["notes"])
