"""GET /api/v1/instances/{id}/summary and the instance page's opening verdict: tokens by source,
hit rates and the worth figures over a range equal vLLM's own counter deltas over it, and the page
shows the same sentence the API returns.

Data: the recorded workload of tests/app/dashboard/recorded.py (made-up values, labelled so there),
written through the real ingest writer into the test's SQLite file.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from app.ingest.parse import parse_batch
from app.storage.ingest_store import IngestWriter
from kvcore.exposition import parse
from kvcore.normalise import KEEP_PREFIXES, normalise
from tests.app.dashboard.recorded import recorded_batches
from tests.fed_databases import Feed
from tests.paths import FIXTURES

T0 = 1_800_000_000.0
N = 120


# 120 recorded batches written by the real ingest writer, once per session; each test gets a copy
FED = Feed("summary", lambda: recorded_batches(T0 - 2000, N, interval=5.0), via="writer")
fed_database = pytest.mark.fed_database(FED)


@pytest.fixture
def fed(engine: Any, client: Any, clock: Any, request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """The batches in the test's database (tests marked fed_database(FED))."""
    assert request.node.get_closest_marker("fed_database"), "mark the test @fed_database"
    batches = FED.batches()
    clock.t = batches[-1]["sent_at"] + 3
    return batches


def _counter(batch: dict[str, Any], name: str, source: str | None = None) -> float:
    total = 0.0
    for s in batch["scrapes"][0]["samples"]:
        if s["name"] == name and (source is None or s["labels"].get("source") == source):
            total += float(s["value"])
    return total


def _delta(batches: list[dict[str, Any]], start: float, end: float, name: str, source: str | None = None) -> float:
    """vLLM's counter at the last scrape <= end minus at the last scrape < start (no restart here)."""
    before = [b for b in batches if b["scrapes"][0]["ts"] < start]
    upto = [b for b in batches if b["scrapes"][0]["ts"] <= end]
    return _counter(upto[-1], name, source) - (_counter(before[-1], name, source) if before else 0.0)


@fed_database
def test_summary_over_a_window_equals_vllm_counter_deltas(client: Any, fed: list[dict[str, Any]]) -> None:
    ts = [b["scrapes"][0]["ts"] for b in fed]
    start, end = ts[30] + 1.3, ts[90] + 2.1  # both edges between scrapes
    r = client.get("/api/v1/instances/1/summary", params={"range": "custom", "start": start, "end": end})
    assert r.status_code == 200, r.text
    body = r.json()

    def d(name: str, source: str | None = None) -> float:
        return _delta(fed, start, end, name, source)

    by = "vllm:prompt_tokens_by_source_total"
    assert body["tokens"] == {
        "gpu_hit": pytest.approx(d(by, "local_cache_hit")),
        "offload_reload": pytest.approx(d(by, "external_kv_transfer")),
        "recompute": pytest.approx(d(by, "local_compute")),
    }
    hr = body["hit_rate"]
    assert hr["gpu"] == pytest.approx(d("vllm:prefix_cache_hits_total") / d("vllm:prefix_cache_queries_total"))
    assert hr["offload"] == pytest.approx(
        d("vllm:external_prefix_cache_hits_total") / d("vllm:external_prefix_cache_queries_total")
    )
    assert hr["overall"] == pytest.approx(d("vllm:prompt_tokens_cached_total") / d("vllm:prompt_tokens_total"))
    w = body["worth"]
    prefill_tps = d(by, "local_compute") / d("vllm:request_prefill_time_seconds_sum")
    load_t = d("vllm:kv_offload_load_time_total")
    assert w["reloaded_tokens"] == pytest.approx(d(by, "external_kv_transfer"))
    assert w["prefill_tokens_per_s"] == pytest.approx(prefill_tps) and w["prefill_basis"] == "measured"
    assert w["load_gbps"] == pytest.approx(d("vllm:kv_offload_load_bytes_total") / load_t / 1e9)
    assert w["saved_prefill_s"] == pytest.approx(d(by, "external_kv_transfer") / prefill_tps - load_t)
    assert w["tier"] == "CPU" and body["offload_tiers"] == ["CPU"]
    assert w["tone"] == "good" and w["verdict"].startswith("Worth it: CPU reloads of")
    assert f"{d(by, 'external_kv_transfer'):,.0f} tokens" in w["verdict"]


@fed_database
def test_summary_named_range_ends_now(client: Any, fed: list[dict[str, Any]], clock: Any) -> None:
    body = client.get("/api/v1/instances/1/summary", params={"range": "15m"}).json()
    assert body["range"] == "15m" and body["end"] == pytest.approx(clock.t)
    assert body["start"] == pytest.approx(clock.t - 900)
    assert set(body["tokens"]) == {"gpu_hit", "offload_reload", "recompute"}
    assert set(body["hit_rate"]) == {"gpu", "offload", "overall"}
    assert {"prefill_tokens_per_s", "load_gbps", "reloaded_tokens", "saved_prefill_s", "verdict"} <= set(body["worth"])
    assert all(v is not None for v in body["tokens"].values())


@fed_database
@pytest.mark.parametrize(
    ("params", "status", "says"),
    [
        ({"range": "bogus"}, 400, "unknown range"),
        ({"range": "custom", "start": 100.0}, 400, "needs both start and end"),
        ({"range": "custom", "start": 200.0, "end": 100.0}, 400, "start must be before end"),
        ({"range": "custom", "start": 0.0, "end": 401 * 86400.0}, 400, "at most 400 days"),
        ({"range": "custom", "start": "abc", "end": 100.0}, 422, ""),
    ],
)
def test_summary_refuses_bad_ranges_with_a_message(
    client: Any, fed: list[dict[str, Any]], params: dict[str, Any], status: int, says: str
) -> None:
    r = client.get("/api/v1/instances/1/summary", params=params)
    assert r.status_code == status, r.text
    assert says in r.text
    assert "Traceback" not in r.text


@fed_database
def test_summary_of_an_unknown_instance_is_a_404_with_a_message(client: Any, fed: list[dict[str, Any]]) -> None:
    r = client.get("/api/v1/instances/99/summary", params={"range": "15m"})
    assert r.status_code == 404 and "no instance 99" in r.text


@fed_database
def test_the_instance_page_opens_with_the_api_verdict_and_its_numbers(client: Any, fed: list[dict[str, Any]]) -> None:
    ts = [b["scrapes"][0]["ts"] for b in fed]
    params = {"range": "custom", "start": ts[10] + 0.5, "end": ts[100] + 0.5}
    api = client.get("/api/v1/instances/1/summary", params=params).json()
    page = client.get("/instances/1", params=params)
    assert page.status_code == 200
    html = page.text
    head = html[html.index('id="summary"') : html.index("</section>", html.index('id="summary"'))]
    verdict = re.search(r'data-testid="summary-verdict">([^<]*)<', head)
    assert verdict is not None
    assert verdict.group(1).replace("&#39;", "'") == api["worth"]["verdict"]
    assert f"{api['worth']['reloaded_tokens']:,.0f}" in head
    assert f"{api['worth']['prefill_tokens_per_s']:,.0f} tok/s" in head
    assert f"{api['worth']['saved_prefill_s']:,.1f} s" in head
    assert html.index('id="summary"') < html.index('class="grid"')  # before the charts
    assert "None" not in head and "nan" not in head
    frag = client.get("/instances/1/fragments/summary", params=params)
    assert frag.status_code == 200 and api["worth"]["verdict"].split(":")[0] in frag.text


EXAMPLE_CONNECTOR = FIXTURES / "vllm"
EXAMPLE_CONNECTOR = EXAMPLE_CONNECTOR / "real__vllm-0.32.0-cpu__tiny-llama__example-connector.prom"


def _disk_batches(t0: float) -> list[dict[str, Any]]:
    """Scrapes of a real vLLM running ExampleConnector (a disk store, no CPU offload size): the
    captured /metrics last, and before it made-up earlier scrapes with every counter at 1/8, 2/8
    ... of its value (so the range has increases, the rate charts several points)."""
    norm = normalise(parse(EXAMPLE_CONNECTOR.read_text(), KEEP_PREFIXES))
    out = []
    for i, k in enumerate(n / 8 for n in range(1, 9)):
        samples = [
            {"name": n, "labels": dict(lab), "value": v * k if n.endswith(("_total", "_sum", "_count")) else v}
            for n, lab, v in norm.samples
        ]
        ts = t0 + 5.0 * i
        scrape = {"instance": "http://127.0.0.1:8000", "ts": ts, "ok": True, "healthy": True, "types": norm.types}
        out.append(
            {"agent_id": "a", "host": "rig1", "seq": i + 1, "sent_at": ts, "scrapes": [{**scrape, "samples": samples}]}
        )
    return out


def test_a_disk_connector_is_an_offload_tier_named_by_what_it_is(engine: Any, client: Any, clock: Any) -> None:
    from app.storage import rollouts_store as rs

    batches = _disk_batches(clock() - 60)
    writer = IngestWriter(engine)
    for b in batches:
        writer.write(parse_batch(json.dumps(b).encode(), b["sent_at"], max_future_skew_s=300, max_past_age_s=1e9), 0)
    params = {"range": "custom", "start": batches[0]["sent_at"] + 1, "end": batches[-1]["sent_at"] + 1}
    body = client.get("/api/v1/instances/1/summary", params=params).json()
    assert body["tokens"]["offload_reload"] == 1024 * 7 / 8 and body["offload_tiers"] == ["external connector"]
    w = body["worth"]
    assert w["reloaded_tokens"] == 896 and w["tier"] == "external connector"
    assert "Offload is off" not in w["verdict"] and "external connector" in w["verdict"]
    assert w["prefill_basis"] == "measured" and w["prefill_tokens_per_s"] > 0 and w["load_gbps"] is None

    # kvscope started it with ExampleConnector: the tier is named for what that connector is (disk)
    prof = rs.create_profile(engine, "disk", {}, clock())
    argv = ["--kv-transfer-config", json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both"})]
    rid = rs.create_rollout(
        engine, instance_id=1, version_id=prof["version_id"], lkg_version_id=None, payload={"argv": argv}, now=clock()
    )
    assert rs.finish_rollout(engine, rid, "healthy", "test", clock(), only_from=("requested",))
    body = client.get("/api/v1/instances/1/summary", params=params).json()
    assert body["offload_tiers"] == ["disk"] and body["worth"]["verdict"].startswith("Worth it: disk reloads")
    chart = client.get("/api/v1/instances/1/charts/tokens", params=params).json()
    names = [t["name"] for t in chart["figure"]["data"]]
    assert "disk reload" in names and not any("CPU" in n for n in names)
    page = client.get("/instances/1", params=params).text
    assert "tokens reloaded from disk" in page and "offload disk" in page
    assert "tokens reloaded (disk)" in page and "CPU/offload" not in page
