"""The dashboard in real headless Chromium: overview and instance page load with data pushed
through the real ingest API, every chart draws non-empty traces, the range picker changes the
data, the live refresh pauses while the tab is hidden, and the console stays clean."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.dashboard.recorded import recorded_batches
from tests.browser.conftest import LiveApp
from tests.waits import wait_until

pytestmark = [pytest.mark.browser]
CHARTS = ["tokens", "hitrates", "transfer", "pinned", "tiers", "latency", "gpu"]
SCREENSHOTS = os.environ.get("KVSCOPE_SCREENSHOTS_DIR")


@pytest.fixture(scope="module")
def live(tmp_path_factory: Any, chromium_context: Any) -> Iterator[LiveApp]:
    app = LiveApp(tmp_path_factory.mktemp("browser-app"))
    app.start()
    app.login(chromium_context)
    try:
        now = time.time()
        # 50 minutes of scrapes ending now, every 10 s (what the charts of 15 min to 1 h need:
        # each has many points per trace), with a restart 35 minutes in, through the real HTTP
        # ingest API
        batches = recorded_batches(now - 3000, 300, interval=10.0, reset_at=210, simulated=True)
        shift = now - 1 - batches[-1]["sent_at"]
        with httpx.Client(base_url=app.url, headers={"Authorization": f"Bearer {app.token}"}) as c:
            for b in batches:
                _shift(b, shift)
                r = c.post("/api/v1/ingest", json=b)
                assert r.status_code == 200, r.text
        yield app
    finally:
        app.stop()


def _shift(batch: dict[str, Any], dt: float) -> None:
    batch["sent_at"] += dt
    batch["host_ts"] += dt
    for s in batch["scrapes"]:
        s["ts"] += dt


def _chart_state(page: Any, key: str) -> dict[str, Any]:
    return page.evaluate(
        """(key) => {
            const el = document.querySelector(`#chart-${key} .chart`);
            if (!el || !el.data) { return {rendered: false}; }
            const traces = el.data.filter(t => t.name !== "events");
            return {
              rendered: el.dataset.rendered === "1",
              svg: !!el.querySelector(".main-svg"),
              traces: traces.map(t => ({name: t.name, points: t.y.filter(v => v !== null).length})),
              x0: traces.length ? (traces[0].x ? traces[0].x[0] : traces[0].x0) : null,
              n: traces.length ? traces[0].y.length : 0,
              range: el.layout.xaxis.range,
            };
        }""",
        key,
    )


def _wait_charts(page: Any) -> None:
    page.wait_for_function(
        "() => document.querySelectorAll('.chart-panel .chart[data-rendered=\"1\"]').length === 7", timeout=30_000
    )


def test_overview_loads_with_state_and_sparklines(live: LiveApp, page: Any) -> None:
    p, log = page
    p.goto(live.url + "/")
    p.wait_for_selector(".instance-card")
    p.wait_for_function("() => document.querySelectorAll('.spark[data-rendered=\"1\"]').length === 2", timeout=20_000)
    assert p.locator(".instance-card [data-state]").first.get_attribute("data-state") == "up"
    assert p.locator(".instance-card .badge.sim").count() == 1
    assert p.locator(".spark .main-svg").count() >= 2
    if SCREENSHOTS:
        _shots(p, "overview")
    assert log.errors == []


def test_instance_page_draws_every_chart_with_data(live: LiveApp, page: Any) -> None:
    p, log = page
    p.goto(live.url + "/instances/1?range=1h")
    _wait_charts(p)
    for key in CHARTS:
        st = _chart_state(p, key)
        assert st["rendered"] and st["svg"], key
        assert st["traces"], key
        assert all(t["points"] > 0 for t in st["traces"]), (key, st["traces"])
    assert p.locator("#worth .verdict").inner_text().strip()
    if SCREENSHOTS:
        _shots(p, "instance")
    assert log.errors == []


def _overlaps(a: dict[str, float] | None, b: dict[str, float] | None) -> bool:
    if not a or not b:
        return False
    return not (
        a["right"] <= b["left"] or b["right"] <= a["left"] or a["bottom"] <= b["top"] or b["bottom"] <= a["top"]
    )


@pytest.mark.parametrize("width", [1400, 390])
def test_legends_axis_titles_and_modebar_do_not_overlap(live: LiveApp, page: Any, width: int) -> None:
    """Every chart: the legend clears the x-axis title and the plot area, and the modebar
    (shown on hover) clears the legend, the plot area and the panel title."""
    p, log = page
    p.set_viewport_size({"width": width, "height": 1000})
    p.goto(live.url + "/instances/1?range=1h")
    _wait_charts(p)
    for key in CHARTS:
        p.hover(f"#chart-{key} .chart")  # shows the modebar
        boxes = p.evaluate(
            """(key) => {
                const root = document.querySelector(`#chart-${key}`);
                const box = (sel) => { const e = root.querySelector(sel); if (!e) return null;
                  const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
                  bottom: r.bottom}; };
                const plots = [...root.querySelectorAll('.nsewdrag')].map(e => { const r = e.getBoundingClientRect();
                  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; });
                return {legend: box('.legend'), xtitle: box('.g-xtitle'), modebar: box('.modebar'),
                        title: box('h2'), plots: plots};
            }""",
            key,
        )
        assert boxes["legend"] and boxes["xtitle"] and boxes["modebar"] and boxes["plots"], (key, boxes)
        assert not _overlaps(boxes["legend"], boxes["xtitle"]), (key, width, boxes)
        assert not _overlaps(boxes["modebar"], boxes["legend"]), (key, width, boxes)
        assert not _overlaps(boxes["modebar"], boxes["title"]), (key, width, boxes)
        for plot in boxes["plots"]:
            assert not _overlaps(boxes["legend"], plot), (key, width, boxes)
            assert not _overlaps(boxes["modebar"], plot), (key, width, boxes)
    assert log.errors == []


def test_range_picker_changes_the_data(live: LiveApp, page: Any) -> None:
    p, log = page
    p.goto(live.url + "/instances/1?range=1h")
    _wait_charts(p)
    before = _chart_state(p, "tokens")
    p.click("#range-picker button[data-range='15m']")
    p.wait_for_function(
        "(x0) => { const el = document.querySelector('#chart-tokens .chart');"
        " return el && el.dataset.rendered === '1' && el.data"
        " && (el.data[0].x ? el.data[0].x[0] : el.data[0].x0) !== x0; }",
        arg=before["x0"],
        timeout=20_000,
    )
    _wait_charts(p)
    after = _chart_state(p, "tokens")
    assert after["x0"] > before["x0"]
    assert after["range"] != before["range"]
    assert all(t["points"] > 0 for t in after["traces"])
    assert "range=15m" in p.url
    assert p.locator("#range-picker button[data-range='15m']").get_attribute("aria-pressed") == "true"
    # a custom range: the last 20 minutes
    p.click("#range-picker button[data-range='custom']")
    p.evaluate("""() => {
        const f = document.getElementById('custom-range');
        const fmt = d => {
            d = new Date(d.getTime() - d.getTimezoneOffset() * 60000); return d.toISOString().slice(0, 16);
        };
        f.elements.start.value = fmt(new Date(Date.now() - 20 * 60000));
        f.elements.end.value = fmt(new Date());
    }""")
    p.click("#custom-range button[type='submit']")
    p.wait_for_function("() => location.search.includes('range=custom')")
    p.wait_for_function(
        "(x0) => { const el = document.querySelector('#chart-tokens .chart');"
        " return el && el.dataset.rendered === '1' && el.data"
        " && (el.data[0].x ? el.data[0].x[0] : el.data[0].x0) !== x0; }",
        arg=after["x0"],
        timeout=20_000,
    )
    assert log.errors == []


def test_live_refresh_pauses_while_the_tab_is_hidden(live: LiveApp, page: Any) -> None:
    p, log = page
    p.clock.install()
    p.goto(live.url + "/instances/1?range=15m")
    _wait_charts(p)
    fragments: list[str] = []
    p.on("request", lambda r: fragments.append(r.url) if "/instances/1/fragments/" in r.url else None)
    p.evaluate("""() => {
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    assert "paused" in p.locator("#live-status").inner_text()
    p.clock.run_for(40_000)
    p.wait_for_timeout(300)
    assert fragments == []
    p.evaluate("""() => {
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    p.wait_for_function("() => !document.querySelector('#live-status').textContent.includes('paused')")
    # 7 charts + the worth panel; the page's own timer pumps Playwright's events meanwhile
    wait_until(lambda: p.wait_for_timeout(100) or len(fragments) >= 8, "the 8 fragments refreshed", 10, interval=0)
    assert log.errors == []


def _shots(p: Any, name: str) -> None:
    out = Path(SCREENSHOTS or ".")
    out.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        p.emulate_media(color_scheme=scheme)
        p.wait_for_timeout(600)  # let the charts re-theme
        p.screenshot(path=str(out / f"{name}-{scheme}.png"), full_page=True)
    p.emulate_media(color_scheme="light")


def test_usable_on_a_phone(live: LiveApp, page: Any) -> None:
    p, log = page
    p.set_viewport_size({"width": 390, "height": 844})
    for path in ("/", "/instances/1?range=1h"):
        p.goto(live.url + path)
        if path != "/":
            _wait_charts(p)
        overflow = p.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{path}: {overflow}px wider than the phone screen"
    # the range picker buttons are big enough to tap
    box = p.locator("#range-picker button[data-range='15m']").bounding_box()
    assert box is not None and box["height"] >= 32
    assert log.errors == []


def test_at_390_px_every_legend_entry_shows_and_axis_titles_do_not_overlap(live: LiveApp, page: Any) -> None:
    """A phone: the legend wraps and its chart grows, so no entry is cut off by the chart's box;
    the stacked sub-plots' y-axis titles stay apart; the refresh asks for the plot's width."""
    p, log = page
    p.set_viewport_size({"width": 390, "height": 844})
    p.goto(live.url + "/instances/1?range=1h")
    _wait_charts(p)
    for key in CHARTS:
        got = p.evaluate(
            """(key) => {
                const chart = document.querySelector(`#chart-${key} .chart`);
                const c = chart.getBoundingClientRect();
                const items = [...chart.querySelectorAll('.legend .traces')].map(e => e.getBoundingClientRect());
                const titles = [...chart.querySelectorAll('.g-ytitle, [class^="g-y"][class$="title"]')]
                  .map(e => e.getBoundingClientRect()).filter(r => r.height > 0);
                return {chart: {top: c.top, bottom: c.bottom, left: c.left, right: c.right},
                        items: items.map(r => ({top: r.top, bottom: r.bottom, left: r.left, right: r.right})),
                        titles: titles.map(r => ({top: r.top, bottom: r.bottom, left: r.left, right: r.right})),
                        traces: chart.data.filter(t => t.name !== 'events').length};
            }""",
            key,
        )
        assert len(got["items"]) == got["traces"], (key, got)
        for it in got["items"]:
            assert got["chart"]["top"] <= it["top"] and it["bottom"] <= got["chart"]["bottom"] + 1, (key, it, got)
            assert it["right"] <= got["chart"]["right"] + 1, (key, it)
        titles = got["titles"]
        for i, a in enumerate(titles):
            for b in titles[i + 1 :]:
                assert not _overlaps(a, b), (key, a, b)
    with p.expect_request(lambda r: "/fragments/chart/tokens" in r.url) as req:
        p.evaluate("() => window.htmx.trigger(document.body, 'kvs-refresh')")
    px = int(req.value.url.split("px=")[1].split("&")[0])
    assert 200 <= px <= 390
    # the refreshed chart (swapped in, drawn) has at most one point per pixel column
    p.wait_for_function(
        "(px) => { const el = document.querySelector('#chart-tokens .chart');"
        " return el && el.dataset.rendered === '1' && el.data && el.data[0].y.length <= px; }",
        arg=px,
        timeout=20_000,
    )
    assert log.errors == []
