"""Prometheus as a history source, against a real Prometheus (Debian `prometheus`):

- the same recorded scrapes go into the app's store (through the ingest API) and into a
  Prometheus (backfilled with promtool): every chart and the worth figures come out identical
  from both sources (same derived code, same raw points recovered through query_range);
- a Prometheus that scrapes a live exposition server on a loopback port is read back with
  vLLM's labels, real sample times and the served values.
"""

from __future__ import annotations

import functools
import http.server
import math
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.export.prometheus_source import (
    PrometheusError,
    PrometheusSource,
    assemble,
    choose_step,
    instance_target,
    prometheus_scope,
    scrape_interval,
    selector,
)
from tests.fed_databases import Feed
from tests.ports import free_port
from tests.scale.prom import PromServer, backfill, binaries, openmetrics
from tests.tiers import unavailable
from tests.waits import wait_until

pytestmark = pytest.mark.prometheus
REPO = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:8000"
LAB = {"model_name": "qwen", "engine": "0"}
TTFT_LE = ["0.01", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "+Inf"]
TYPES = {
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:kv_offload_load_bytes": "counter",
    "vllm:kv_offload_load_time": "counter",
    "vllm:kv_offload_store_bytes": "counter",
    "vllm:kv_offload_store_time": "counter",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:kv_offload_cpu_cache_usage_perc": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:cache_config_info": "gauge",
}
CACHE_CFG = {**LAB, "block_size": "16", "kv_offloading_size": "8", "cache_dtype": "auto"}


@pytest.fixture(scope="module")
def prom_bins() -> tuple[str, str]:
    b = binaries()
    if b is None:
        unavailable(
            "prometheus",
            "prometheus/promtool not installed (apt-get install prometheus; scripts/setup.d/45-prometheus.sh)",
        )
    return b


def recorded(t0: float, n: int, interval: float = 5.0, reset_at: int = 120, seed: int = 7) -> list[dict[str, Any]]:
    """n scrapes of a vLLM with CPU offload: jittered gaps, a restart (counters from 0) at reset_at."""
    rnd = random.Random(seed)
    acc: dict[str, float] = {}
    out = []
    ts = t0
    for i in range(n):
        ts += interval + rnd.uniform(-1.0, 1.0)
        if i == reset_at:
            acc = {}
        q = rnd.randint(500, 3000)
        hit = int(q * rnd.uniform(0.2, 0.8))
        ext_q = q - hit
        ext_hit = int(ext_q * rnd.uniform(0.0, 0.6))
        comp = q - hit - ext_hit
        load_b = ext_hit * 147_456
        store_b = comp * 147_456 * rnd.uniform(0.3, 1.0)
        inc = {
            "q": q,
            "hit": hit,
            "ext_q": ext_q,
            "ext_hit": ext_hit,
            "comp": comp,
            "load_b": load_b,
            "load_t": load_b / 12.6e9,
            "store_b": store_b,
            "store_t": store_b / 11e9,
            "prefill": comp / 23_000.0,
            "n": rnd.randint(1, 8),
        }
        for k, v in inc.items():
            acc[k] = acc.get(k, 0.0) + v
        for j, le in enumerate(TTFT_LE):
            extra = 0 if j < 3 else rnd.randint(0, 2)
            acc[f"le{le}"] = acc.get(f"le{le}", 0.0) + inc["n"] * (j + 1) / len(TTFT_LE) + extra
        acc["ttft_sum"] = acc.get("ttft_sum", 0.0) + inc["n"] * rnd.uniform(0.05, 0.6)
        # cumulative bucket counts must be monotonic in le
        run = 0.0
        for le in TTFT_LE:
            run = max(run, acc[f"le{le}"])
            acc[f"le{le}"] = run
        samples = [
            ("vllm:prefix_cache_queries_total", LAB, acc["q"]),
            ("vllm:prefix_cache_hits_total", LAB, acc["hit"]),
            ("vllm:external_prefix_cache_queries_total", LAB, acc["ext_q"]),
            ("vllm:external_prefix_cache_hits_total", LAB, acc["ext_hit"]),
            ("vllm:prompt_tokens_total", LAB, acc["q"]),
            ("vllm:prompt_tokens_cached_total", LAB, acc["hit"] + acc["ext_hit"]),
            ("vllm:prompt_tokens_by_source_total", {**LAB, "source": "local_compute"}, acc["comp"]),
            ("vllm:prompt_tokens_by_source_total", {**LAB, "source": "local_cache_hit"}, acc["hit"]),
            ("vllm:prompt_tokens_by_source_total", {**LAB, "source": "external_kv_transfer"}, acc["ext_hit"]),
            ("vllm:kv_offload_load_bytes_total", LAB, acc["load_b"]),
            ("vllm:kv_offload_load_time_total", LAB, acc["load_t"]),
            ("vllm:kv_offload_store_bytes_total", LAB, acc["store_b"]),
            ("vllm:kv_offload_store_time_total", LAB, acc["store_t"]),
            ("vllm:request_prefill_time_seconds_sum", LAB, acc["prefill"]),
            ("vllm:request_prefill_time_seconds_count", LAB, acc["n"]),
            ("vllm:kv_cache_usage_perc", LAB, rnd.uniform(0.1, 0.95)),
            ("vllm:kv_offload_cpu_cache_usage_perc", LAB, rnd.uniform(0.0, 0.2)),
            ("vllm:num_requests_running", LAB, float(rnd.randint(0, 6))),
            ("vllm:time_to_first_token_seconds_sum", LAB, acc["ttft_sum"]),
            ("vllm:time_to_first_token_seconds_count", LAB, acc["le+Inf"]),
            ("vllm:cache_config_info", CACHE_CFG, 1.0),
        ] + [("vllm:time_to_first_token_seconds_bucket", {**LAB, "le": le}, acc[f"le{le}"]) for le in TTFT_LE]
        out.append(
            {
                "agent_id": "agent-rig1",
                "host": "rig1",
                "seq": i + 1,
                "sent_at": ts,
                "scrapes": [
                    {
                        "instance": URL,
                        "ts": ts,
                        "ok": True,
                        "healthy": True,
                        "model": "qwen",
                        "types": TYPES,
                        "samples": [{"name": n_, "labels": la, "value": float(v)} for n_, la, v in samples],
                    }
                ],
                "host_ts": ts,
                "host_samples": [
                    {
                        "name": "kvscope:gpu_pcie_link_gen",
                        "labels": {"gpu": "0", "name": "H200", "kind": "max"},
                        "value": 5.0,
                    },
                    {
                        "name": "kvscope:gpu_pcie_link_width",
                        "labels": {"gpu": "0", "name": "H200", "kind": "max"},
                        "value": 16.0,
                    },
                    {"name": "kvscope:host_memory_total_bytes", "labels": {}, "value": 256 * 2.0**30},
                    {"name": "kvscope:host_memory_available_bytes", "labels": {}, "value": 180 * 2.0**30 - i * 1e6},
                ],
            }
        )
    return out


def _to_openmetrics(batches: list[dict[str, Any]]) -> str:
    """What a Prometheus scraping that vLLM would hold: instance samples, target labels added,
    timestamps at the millisecond as the store keeps them."""
    target = {"instance": instance_target(URL), "job": "vllm"}
    return openmetrics(
        (s["name"], {**s["labels"], **target}, s["value"], round(sc["ts"] * 1000) / 1000)
        for b in batches
        for sc in b["scrapes"]
        for s in sc["samples"]
    )


# Minute-aligned, in the past; a constant, so every xdist worker makes the same batches (the
# fed database may be built by another worker than the one that backfills its Prometheus).
T0 = 1_700_000_040.0
# The scrape interval of the module's Prometheus for the live targets.
SCRAPE_S = 0.5


@functools.cache
def _recorded() -> list[dict[str, Any]]:
    """The module's recorded scrapes, the same in the store and in the backfilled Prometheus."""
    return recorded(T0, 240)


# The store side: the batches POSTed through the ingest API once per session, each test's
# database a copy (tests/fed_databases.py).
RECORDED = Feed("prometheus-source-recorded", _recorded)


class _Exposition(http.server.BaseHTTPRequestHandler):
    """A static exposition server: a real vLLM capture, with its counters advanced per request."""

    body = (REPO / "tests" / "fixtures" / "vllm" / "real__vllm-0.32.0-cpu__tiny-llama__prefix-cache.prom").read_text()
    hits = 0

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        type(self).hits += 1
        extra = f'kvscope_test_scrapes_total{{model_name="tiny"}} {type(self).hits}\n'
        data = (self.body + extra).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@dataclass(frozen=True)
class ModulePrometheus:
    """The module's one Prometheus: `server` holds the recorded batches (backfilled with promtool)
    and scrapes, every SCRAPE_S, the exposition server at `exposition_url` and whatever listens
    on `sim_port` (the sim test's `kvscope sim`). Prometheus 2.42 applies a new target set only
    every 5 s, so both targets are in its configuration from the start: the scraping tests find
    them scraped already, or up on their next scrape. No test writes to it."""

    server: PromServer
    exposition_url: str
    sim_port: int


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: Any, prom_bins: tuple[str, str]) -> Iterator[ModulePrometheus]:
    work = tmp_path_factory.mktemp("prometheus")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    port, sim_port = httpd.server_address[1], free_port()
    server = PromServer(
        prom_bins[0],
        work,
        scrape_interval=f"{round(SCRAPE_S * 1000)}ms",
        scrape_configs=(
            f"  - job_name: vllm\n    static_configs:\n      - targets: ['127.0.0.1:{port}', '127.0.0.1:{sim_port}']\n"
        ),
    )
    try:
        backfill(prom_bins[1], _to_openmetrics(_recorded()), server.storage, work)
        server.start()
        yield ModulePrometheus(server, f"http://127.0.0.1:{port}", sim_port)
    finally:
        server.stop()
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def backfilled(clock: Any, prometheus: ModulePrometheus) -> tuple[list[dict[str, Any]], PromServer]:
    """(batches, Prometheus) for a test marked fed_database(RECORDED); the app's clock just
    after the last batch."""
    batches = _recorded()
    clock.t = batches[-1]["sent_at"] + 2
    return batches, prometheus.server


def _panel_values(panel: Any) -> list[tuple[str, list[float | None]]]:
    return [(t.name, list(t.y)) for t in panel.traces]


def _same(a: list[float | None], b: list[float | None]) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None)
        or (x is not None and y is not None and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9))
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.fed_database(RECORDED)
def test_charts_identical_from_store_and_prometheus(app: Any, backfilled: Any) -> None:
    from app.derived.instance_charts import CHARTS
    from app.derived.panels import make_scope
    from app.derived.worth import compute_worth
    from app.storage.series_store import list_instances

    batches, server = backfilled
    ctx = app.state.ctx
    inst = next(i for i in list_instances(ctx.engine) if i["url"] == URL)
    now = ctx.now()
    first, last = batches[0]["sent_at"], batches[-1]["sent_at"]
    source = PrometheusSource(server.url)
    compared = 0
    for start, end in ((first + 60, last - 3), (first + 300, first + 1500), (first + 500, last - 400)):
        store = make_scope(
            ctx.engine, inst, start=start, end=end, now=now, state="up", raw_retention_s=math.inf, tier="raw"
        )
        prom = prometheus_scope(source, ctx.engine, inst, start=start, end=end, now=now, state="up")
        assert prom.grid == store.grid
        for key, chart in CHARTS.items():
            a, b = chart(store), chart(prom)
            assert prom.error is None, prom.error
            assert a.empty == b.empty, (key, a.empty, b.empty)
            va, vb = _panel_values(a), _panel_values(b)
            assert [n for n, _ in va] == [n for n, _ in vb], key
            for (name, ya), (_, yb) in zip(va, vb, strict=True):
                assert _same(ya, yb), f"{key}/{name} differs between store and Prometheus"
                compared += sum(v is not None for v in ya)
        assert compute_worth(store) == compute_worth(prom)
    assert compared > 1000  # the comparison is not vacuous


@pytest.mark.fed_database(RECORDED)
def test_prometheus_chart_api(client: Any, app: Any, backfilled: Any) -> None:
    batches, server = backfilled
    first, last = batches[0]["sent_at"], batches[-1]["sent_at"]
    params = {"range": "custom", "start": first + 60, "end": last - 3}
    r = client.get("/api/v1/prometheus/instances/1/charts/tokens", params=params)
    assert r.status_code == 404 and "KVSCOPE_PROMETHEUS_URL" in r.json()["error"]
    app.state.ctx.settings.export.prometheus_url = server.url
    try:
        via_prom = client.get("/api/v1/prometheus/instances/1/charts/tokens", params=params)
        via_store = client.get("/api/v1/instances/1/charts/tokens", params={**params, "tier": "raw"})
    finally:
        app.state.ctx.settings.export.prometheus_url = None
    assert via_prom.status_code == 200, via_prom.text
    body = via_prom.json()
    assert body["source"] == "prometheus" and body["figure"] is not None
    assert via_store.status_code == 200
    ys = {t["name"]: t["y"] for t in body["figure"]["data"] if t.get("name") != "events"}
    ys_store = {t["name"]: t["y"] for t in via_store.json()["figure"]["data"] if t.get("name") != "events"}
    assert ys.keys() == ys_store.keys() and ys


def test_unreachable_prometheus_is_a_clear_error() -> None:
    src = PrometheusSource("http://127.0.0.1:9", timeout_s=2.0)
    with pytest.raises(PrometheusError, match="cannot reach Prometheus"):
        src.fetch(["vllm:prompt_tokens_total"], URL, 0.0, 100.0)

    def bad(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "parse error"})

    src = PrometheusSource("http://prom", transport=httpx.MockTransport(bad))
    with pytest.raises(PrometheusError, match="parse error"):
        src.fetch(["vllm:prompt_tokens_total"], URL, 0.0, 100.0)
    html = httpx.MockTransport(lambda r: httpx.Response(200, text="<html>"))
    garbage = PrometheusSource("http://prom", transport=html)
    with pytest.raises(PrometheusError, match="not JSON"):
        garbage.fetch(["x"], URL, 0.0, 100.0)


def test_helpers() -> None:
    assert instance_target("http://127.0.0.1:8000") == "127.0.0.1:8000"
    assert instance_target("http://gpu1.lab") == "gpu1.lab:80"
    assert instance_target("http://[::1]:8000/") == "[::1]:8000"
    assert selector(["b", "a:x"], {"instance": 'h"1'}) == '{__name__=~"a:x|b", instance="h\\"1"}'
    assert choose_step(0, 3600, 1.0) == 1.0
    assert choose_step(0, 30 * 86400, 15.0) == pytest.approx(259.2)
    assert scrape_interval([{"values": [[1, "0"], [16, "0"], [31, "0"]]}, {"junk": 1}]) == 15.0
    assert scrape_interval([]) is None
    # garbage in the matrix is skipped, not fatal; NaN values are dropped
    matrix = [
        {
            "metric": {"__name__": "m_total", "instance": "h:1", "job": "j", "a": "1"},
            "values": [[9.5, "1"], [11.9, "NaN"], [12.9, "5"]],
        },
        {"bad": 1},
        "junk",
        {"metric": {"job": "j"}, "values": [[1, "1"]]},
    ]
    out = assemble(matrix)
    assert len(out) == 1 and out[0].labels == {"a": "1"} and out[0].kind == "counter"
    assert out[0].points == [(9.5, 1.0), (12.9, 5.0)]


def test_long_ranges_use_query_range_under_the_point_limit() -> None:
    """30 days at a 15 s scrape interval is 172,800 samples per series: read through query_range
    at a step that keeps each series under 10,000 points."""
    seen: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        form = dict(x.split("=", 1) for x in request.content.decode().split("&"))
        seen.append({"path": request.url.path, **form})
        metric = {"__name__": "vllm:prompt_tokens_total", "instance": "127.0.0.1:8000", "model_name": "m"}
        if request.url.path == "/api/v1/query":
            vals = [[1000.0 + 15 * i, str(i)] for i in range(60)]
        else:
            step = float(form["step"])
            vals = [[float(form["start"]) + step * i, str(i)] for i in range(3)]
        result = [{"metric": metric, "values": vals}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": result}})

    src = PrometheusSource("http://prom", transport=httpx.MockTransport(handler))
    out = src.fetch(["vllm:prompt_tokens_total"], URL, 0.0, 30 * 86400.0)
    assert src.last_mode == "query_range"
    assert [s["path"] for s in seen] == ["/api/v1/query", "/api/v1/query_range"]
    assert float(seen[1]["step"]) == pytest.approx(259.2)  # 2,592,000 s / 10,000 points
    assert out[0].labels == {"model_name": "m"} and len(out[0].points) == 3
    seen.clear()
    src.fetch(["vllm:prompt_tokens_total"], URL, 0.0, 3600.0)
    assert src.last_mode == "raw" and [s["path"] for s in seen] == ["/api/v1/query", "/api/v1/query"]


def test_reads_a_prometheus_that_scrapes_a_live_server(prometheus: ModulePrometheus) -> None:
    src = PrometheusSource(prometheus.server.url)
    url = prometheus.exposition_url
    names = ["kvscope_test_scrapes_total", "vllm:prompt_tokens_total", "vllm:cache_config_info"]

    def scraped() -> list[Any]:
        now = time.time()
        got = src.fetch(names, url, now - 120, now)
        pts = next((s.points for s in got if s.name == "kvscope_test_scrapes_total"), [])
        return got if len(pts) >= 4 else []

    got = wait_until(scraped, "Prometheus to scrape the server 4 times", timeout=60, interval=0.1)
    by = {s.name: s for s in got}
    scrapes = by["kvscope_test_scrapes_total"]
    # every real sample, with its own time: values count the scrapes, one per scrape interval
    vals = [v for _, v in scrapes.points]
    assert vals == sorted(vals) and len(set(vals)) == len(vals)
    gaps = [b[0] - a[0] for a, b in zip(scrapes.points, scrapes.points[1:], strict=False)]
    assert all(0.5 * SCRAPE_S < g < 3.0 * SCRAPE_S for g in gaps), gaps
    assert scrapes.kind == "counter" and scrapes.labels == {"model_name": "tiny"}
    # vLLM's own labels come through, Prometheus' target labels do not
    pt = by["vllm:prompt_tokens_total"]
    assert "instance" not in pt.labels and "job" not in pt.labels and pt.labels.get("model_name")
    want = next(
        float(line.rsplit(" ", 1)[1])
        for line in _Exposition.body.splitlines()
        if line.startswith("vllm:prompt_tokens_total{")
    )
    assert pt.points[-1][1] == want
    info = by["vllm:cache_config_info"]
    assert info.labels.get("enable_prefix_caching") == "True"


def _by_source(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total{"):
            src = line.split('source="', 1)[1].split('"', 1)[0]
            out[src] = float(line.rsplit(" ", 1)[1])
    return out


def test_reads_a_prometheus_that_scrapes_kvscope_sim(tmp_path: Path, prometheus: ModulePrometheus) -> None:
    """Prometheus scrapes a `kvscope sim` every SCRAPE_S while requests with a shared prefix run;
    the source reads back the by-source token counters the sim reports."""
    from tests.scale.sim import running_sim

    with running_sim(prometheus.sim_port, tmp_path / "sim") as sim_url:
        doc = " ".join(f"word{i}" for i in range(600))
        with httpx.Client(base_url=sim_url, timeout=30) as c:
            for i in range(6):
                r = c.post("/v1/completions", json={"model": "tiny", "prompt": f"{doc} question {i}", "max_tokens": 4})
                assert r.status_code == 200, r.text
            want = _by_source(c.get("/metrics").text)
        assert want.get("local_cache_hit", 0) > 0 and want.get("local_compute", 0) > 0
        src = PrometheusSource(prometheus.server.url)
        got: list[Any] = []
        last: dict[str, float] = {}

        def caught_up() -> bool:
            nonlocal got, last
            now = time.time()
            got = src.fetch(["vllm:prompt_tokens_by_source_total"], sim_url, now - 300, now)
            last = {s.labels.get("source", ""): s.points[-1][1] for s in got if s.points}
            return all(last.get(k) == v for k, v in want.items())

        try:
            wait_until(caught_up, "Prometheus to scrape the sim's counters", timeout=60, interval=0.1)
        except AssertionError:
            pass  # the comparison below says what differs
        assert last == want
        assert all(s.labels.get("model_name") == "tiny" for s in got)
