"""Pages and fragments through the real app: overview, instance page, chart fragments, empty
states that say why, range handling, errors as 4xx with a message, local assets."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.app.dashboard.recorded import fed_app, recorded_batches

CHARTS = ["tokens", "hitrates", "transfer", "pinned", "tiers", "latency", "gpu"]
T0 = 1_800_000_000.0


@pytest.fixture(scope="module")
def fed_module(tmp_path_factory: Any) -> Any:
    batches = recorded_batches(T0 - 1800, 300, interval=5.0, reset_at=200, simulated=True)
    with fed_app(tmp_path_factory.mktemp("fed"), batches, T0) as (app, client, clock):
        yield app, client, clock, batches


@pytest.fixture
def fed(fed_module: Any) -> Any:
    """(client, clock) of the shared fed app; the clock is put back after each test."""
    _app, client, clock, _batches = fed_module
    saved = clock.t
    yield client, clock
    clock.t = saved


def _figures(html: str) -> dict[str, dict[str, Any]]:
    out = {}
    for fid, body in re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', html, re.S):
        out[fid] = json.loads(body)
    return out


def test_overview_without_hosts_says_how_to_start(client: Any) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert "No host has pushed yet" in r.text
    for link in ('href="/"', 'href="/alerts"', 'href="/profiles"', 'href="/experiments"'):
        assert link in r.text


def test_overview_lists_instance_with_state_config_and_sparklines(fed: Any) -> None:
    client, _ = fed
    r = client.get("/")
    assert r.status_code == 200
    html = r.text
    assert 'data-state="up"' in html
    assert "qwen3-8b" in html and "0.33.0" in html
    assert "4 GiB (native)" in html  # offload config from cache_config_info
    assert 'class="badge sim"' in html  # simulated instance labelled
    figs = _figures(html)
    assert {"spark-hit-1", "spark-ttft-1"} <= set(figs)
    for f in figs.values():
        assert any(v is not None for v in f["data"][0]["y"])
    frag = client.get("/fragments/overview")
    assert frag.status_code == 200 and 'id="instances"' in frag.text and "<html" not in frag.text


def test_overview_state_goes_stale_when_the_agent_stops(fed: Any) -> None:
    client, clock = fed
    clock.advance(120)
    assert 'data-state="stale"' in client.get("/").text


def test_instance_page_has_every_chart_with_data_and_the_worth_panel(fed: Any) -> None:
    client, _ = fed
    r = client.get("/instances/1?range=1h")
    assert r.status_code == 200
    figs = _figures(r.text)
    for key in CHARTS:
        fig = figs[f"fig-{key}"]
        traces = [t for t in fig["data"] if t["name"] != "events"]
        assert traces, key
        assert all(any(v is not None for v in t["y"]) for t in traces), key
        for axis, spec in fig["layout"].items():  # units on every visible y axis
            if axis.startswith("yaxis") and spec.get("visible", True):
                assert re.search(r"\(|/s|GiB|GB|%|requests", spec["title"]["text"]), (key, spec)
    assert 'data-verdict="good"' in r.text
    assert "kvscope" in r.text and 'id="range-picker"' in r.text


@pytest.mark.parametrize("rng", ["15m", "1h", "6h", "24h", "7d", "30d"])
def test_chart_fragments_answer_for_every_range(fed: Any, rng: str) -> None:
    client, _ = fed
    for key in CHARTS:
        r = client.get(f"/instances/1/fragments/chart/{key}?range={rng}")
        assert r.status_code == 200, (key, r.text)
        assert f'id="chart-{key}"' in r.text and "<html" not in r.text


def test_range_changes_the_data(fed: Any) -> None:
    client, _ = fed
    a = client.get("/api/v1/instances/1/charts/tokens?range=15m").json()
    b = client.get("/api/v1/instances/1/charts/tokens?range=1h").json()
    assert a["end"] - a["start"] == 900 and b["end"] - b["start"] == 3600
    assert a["figure"]["data"][0]["x"] != b["figure"]["data"][0]["x"]
    assert a["points"] <= 1601 and b["points"] <= 1601


def test_custom_range_and_bad_input_are_4xx_with_a_message(fed: Any) -> None:
    client, clock = fed
    now = clock()
    ok = client.get(f"/instances/1/fragments/chart/tokens?range=custom&start={now - 600}&end={now}")
    assert ok.status_code == 200
    for url in (
        "/instances/1/fragments/chart/tokens?range=2w",
        f"/instances/1/fragments/chart/tokens?range=custom&start={now}&end={now - 5}",
        "/instances/1/fragments/chart/tokens?range=custom&start=1",
        "/api/v1/instances/1/charts/tokens?tier=5m",
    ):
        r = client.get(url)
        assert 400 <= r.status_code < 500, url
        assert "Traceback" not in r.text
        if url.startswith("/api/"):  # the API answers JSON; a page or fragment its HTML error in the frame
            assert r.json().get("error")
        else:
            assert r.headers["content-type"].startswith("text/html") and 'data-error="' in r.text
    assert client.get("/instances/99").status_code == 404
    assert client.get("/api/v1/instances/1/charts/nope").status_code == 404


def test_events_are_vertical_annotations_with_hover_text(fed: Any) -> None:
    client, _ = fed
    fig = client.get("/api/v1/instances/1/charts/hitrates?range=1h").json()["figure"]
    ev = [t for t in fig["data"] if t["name"] == "events"]
    assert ev and ev[0]["hovertext"] and "counter_reset" in ev[0]["hovertext"][0]
    assert any(s["yref"] == "paper" and s["x0"] == s["x1"] for s in fig["layout"]["shapes"])


def test_empty_states_say_why(client: Any, token: str, clock: Any, batch_factory: Any) -> None:
    # an instance without offload and a host whose agent found no GPU
    t = clock()
    for seq in range(1, 6):
        b = batch_factory(
            seq,
            t - 50 + seq * 5,
            samples=[
                ("vllm:prompt_tokens_total", {"model_name": "m"}, 100.0 * seq),
                (
                    "vllm:cache_config_info",
                    {"model_name": "m", "kv_offloading_size": "None", "block_size": "2096"},
                    1.0,
                ),
            ],
        )
        b["host_ts"] = b["sent_at"]
        b["host_samples"] = [
            {"name": "kvscope:gpu_count", "labels": {}, "value": 0.0},
            {"name": "kvscope:gpu_source_info", "labels": {"source": "none"}, "value": 1.0},
        ]
        r = client.post("/api/v1/ingest", json=b, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
    clock.t = t + 2

    def empty(key: str) -> str | None:
        return client.get(f"/api/v1/instances/1/charts/{key}?range=15m").json()["empty"]

    assert "no CPU offload configured" in (empty("transfer") or "")
    assert "no GPU on this host" in (empty("gpu") or "")
    assert "no " in (empty("latency") or "")
    page = client.get("/instances/1?range=15m").text
    assert 'class="empty"' in page and "Offload is off" in page
    clock.advance(600)
    assert "agent stale" in (empty("tokens") or "")


def test_hybrid_block_size_is_called_out(client: Any, token: str, clock: Any, batch_factory: Any) -> None:
    t = clock()
    for seq in range(1, 5):
        b = batch_factory(
            seq,
            t - 40 + seq * 5,
            samples=[
                ("vllm:prefix_cache_queries_total", {"model_name": "m"}, 1000.0 * seq),
                ("vllm:prefix_cache_hits_total", {"model_name": "m"}, 0.0),
                ("vllm:cache_config_info", {"model_name": "m", "block_size": "2096"}, 1.0),
            ],
            types={"vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter"},
        )
        assert client.post("/api/v1/ingest", json=b, headers={"Authorization": f"Bearer {token}"}).status_code == 200
    clock.t = t + 1
    body = client.get("/api/v1/instances/1/charts/hitrates?range=15m").json()
    assert any("2096" in n and "never hits" in n for n in body["notes"])


def test_assets_are_served_locally(client: Any) -> None:
    htmx = client.get("/static/vendor/htmx.min.js")
    assert htmx.status_code == 200 and "htmx" in htmx.text[:2000]
    plotly = client.get("/static/vendor/plotly-cartesian-4.1.1.min.js")
    assert plotly.status_code == 200 and "plotly.js (cartesian - minified) v4.1.1" in plotly.text[:200]
    assert client.get("/static/css/kvscope.css").status_code == 200
    assert client.get("/static/js/dashboard.js").status_code == 200
    page = client.get("/").text
    assert "http://" not in re.sub(r"<code>.*?</code>", "", page) and "https://" not in page


def test_rollup_job_is_registered_and_charts_read_the_rollups(fed_module: Any) -> None:
    from app.web.jobs import run_job_now

    app, client, clock, _ = fed_module
    before = client.get("/api/v1/instances/1/charts/tokens?range=24h").json()
    run_job_now(app.state.ctx, "rollups", now=clock() + 600)
    after = client.get("/api/v1/instances/1/charts/tokens?range=24h").json()
    assert before["tier"] == after["tier"] == "1m"
    # the same minutes whether folded on the fly (before the job) or read from the rollup table
    for a, b in zip(before["figure"]["data"], after["figure"]["data"], strict=True):
        assert a["x"] == b["x"]
        if a["name"] != "events":
            assert [y is None for y in a["y"]] == [y is None for y in b["y"]]
            assert any(y is not None for y in a["y"])
            for ya, yb in zip(a["y"], b["y"], strict=True):
                assert ya is None or ya == pytest.approx(yb, rel=1e-9)


def test_restarting_then_down(client: Any, token: str, clock: Any, batch_factory: Any) -> None:
    t = clock()
    auth = {"Authorization": f"Bearer {token}"}
    assert client.post("/api/v1/ingest", json=batch_factory(1, t - 10), headers=auth).status_code == 200
    b = batch_factory(2, t - 5)
    b["scrapes"][0].update(ok=False, healthy=False, error="connection refused", samples=[])
    b["events"] = [
        {
            "ts": t - 6,
            "kind": "restart",
            "message": "vLLM restarted by the launcher",
            "instance": "http://127.0.0.1:8000",
        }
    ]
    assert client.post("/api/v1/ingest", json=b, headers=auth).status_code == 200
    html = client.get("/").text
    assert 'data-state="restarting"' in html and "connection refused" in html
    # still down long after the restart event: plain down
    clock.advance(3600)
    b3 = batch_factory(3, clock() - 1)
    b3["scrapes"][0].update(ok=False, healthy=False, error="connection refused", samples=[])
    assert client.post("/api/v1/ingest", json=b3, headers=auth).status_code == 200
    assert 'data-state="down"' in client.get("/").text


def test_instance_page_links_apply_ab_alert_rules_and_loads_rollouts(
    client: Any, token: str, clock: Any, batch_factory: Any
) -> None:
    """The instance page is where a user starts a switch or an A/B: the links must lead somewhere real."""
    r = client.post("/api/v1/ingest", json=batch_factory(1, clock()), headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    page = client.get(f"/instances/{iid}")
    assert page.status_code == 200
    for href in (
        f"/instances/{iid}/apply",
        f"/instances/{iid}/experiment",
        f"/alerts/rules?instance={iid}",
        f"/instances/{iid}/rollouts",
    ):
        assert href in page.text
        target = client.get(href)
        assert target.status_code == 200, (href, target.text[:300])
