"""Overview sparklines with little data: a fresh instance with a few minutes in the last hour
shows its points (x range = the data's span, markers, no x tick labels, tight y range)."""

from __future__ import annotations

import json
import re
from typing import Any

from app.charts.figures import sparkline
from tests.app.dashboard.recorded import fed_app, recorded_batches

T0 = 1_800_000_000.0


def test_sparkline_of_few_points_zooms_to_them_with_markers() -> None:
    xs = [T0 + 30 * i for i in range(120)]  # an hour of 30 s instants
    ys: list[float | None] = [None] * 114 + [40.0, 42.0, None, 47.0, 45.0, 44.0]
    fig = sparkline(xs, ys, "%", "#2ca02c")
    lay = fig["layout"]
    assert lay["xaxis"]["showticklabels"] is False
    x0, x1 = lay["xaxis"]["range"]
    span = (xs[119] - xs[114]) * 1000
    assert xs[114] * 1000 - 0.05 * span <= x0 < xs[114] * 1000  # the data's span, a little padded
    assert xs[119] * 1000 < x1 <= xs[119] * 1000 + 0.05 * span
    lo, hi = lay["yaxis"]["range"]
    assert 39.0 < lo < 40.0 and 47.0 < hi < 48.0  # tight around 40..47, not from 0
    tr = fig["data"][0]
    assert "markers" in tr["mode"]
    assert [v for v in tr["y"] if v is not None] == [40.0, 42.0, 47.0, 45.0, 44.0]
    assert lay["meta"]["points"] == 5


def test_sparkline_of_one_point_gets_a_visible_range() -> None:
    xs = [T0 + 30 * i for i in range(10)]
    fig = sparkline(xs, [None] * 9 + [12.5], "ms", "#ff7f0e")
    x0, x1 = fig["layout"]["xaxis"]["range"]
    assert x0 < round(xs[-1] * 1000) < x1
    y0, y1 = fig["layout"]["yaxis"]["range"]
    assert y0 < 12.5 < y1
    assert "markers" in fig["data"][0]["mode"]


def test_sparkline_of_a_full_hour_is_a_line_without_range_padding() -> None:
    xs = [T0 + 30 * i for i in range(120)]
    ys: list[float | None] = [float(i % 7) for i in range(120)]
    fig = sparkline(xs, ys, "%", "#2ca02c")
    assert fig["data"][0]["mode"] == "lines"
    x0, x1 = fig["layout"]["xaxis"]["range"]
    assert xs[0] * 1000 - 120_000 <= x0 < xs[0] * 1000 and xs[-1] * 1000 < x1 <= xs[-1] * 1000 + 120_000


def test_sparkline_without_points_has_no_range() -> None:
    fig = sparkline([T0, T0 + 30], [None, None], "%", "#2ca02c")
    assert "range" not in fig["layout"]["xaxis"] and fig["layout"]["meta"]["points"] == 0


def test_overview_of_a_fresh_instance_shows_its_few_minutes(tmp_path: Any) -> None:
    batches = recorded_batches(T0 - 240, 48, interval=5.0)  # 4 minutes of scrapes
    with fed_app(tmp_path, batches, T0) as (_app, client, _clock):
        html = client.get("/").text
    figs = {
        fid: json.loads(body)
        for fid, body in re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', html, re.S)
    }
    first, last = batches[0]["sent_at"], batches[-1]["sent_at"]
    for fid in ("spark-hit-1", "spark-ttft-1"):
        fig = figs[fid]
        tr = fig["data"][0]
        shown = [(x, y) for x, y in zip(tr["x"], tr["y"], strict=True) if y is not None]
        assert len(shown) >= 4, fid
        assert "markers" in tr["mode"], fid
        x0, x1 = fig["layout"]["xaxis"]["range"]
        # the x range is the data's few minutes, not the whole hour
        assert first * 1000 - 60_000 <= x0 and x1 <= last * 1000 + 60_000, fid
        pad = 0.05 * (shown[-1][0] - shown[0][0])
        assert shown[0][0] - pad <= x0 < shown[0][0] and shown[-1][0] < x1 <= shown[-1][0] + pad, fid
        assert fig["layout"]["xaxis"]["showticklabels"] is False
        y0, y1 = fig["layout"]["yaxis"]["range"]
        assert all(y0 <= y <= y1 for _, y in shown), fid
