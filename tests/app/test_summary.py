"""GET /api/v1/instances/{id}/summary and the instance page's opening verdict: tokens by source,
hit rates and the worth figures over a range equal vLLM's own counter deltas over it, and the page
shows the same sentence the API returns.

Data: the recorded workload of tests/app/pages/recorded.py (made-up values, labelled so there),
written through the real ingest writer into the test's SQLite file.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from app.ingest import parse_batch
from app.storage.ingest_store import IngestWriter
from tests.app.pages.recorded import recorded_batches

T0 = 1_800_000_000.0
N = 120


@pytest.fixture
def fed(engine: Any, client: Any, clock: Any) -> list[dict[str, Any]]:
    batches = recorded_batches(T0 - 2000, N, interval=5.0)
    writer = IngestWriter(engine)
    for b in batches:
        writer.write(
            parse_batch(json.dumps(b).encode(), b["sent_at"], max_future_skew_s=300, max_past_age_s=1e9), b["sent_at"]
        )
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


def test_summary_named_range_ends_now(client: Any, fed: list[dict[str, Any]], clock: Any) -> None:
    body = client.get("/api/v1/instances/1/summary", params={"range": "15m"}).json()
    assert body["range"] == "15m" and body["end"] == pytest.approx(clock.t)
    assert body["start"] == pytest.approx(clock.t - 900)
    assert set(body["tokens"]) == {"gpu_hit", "offload_reload", "recompute"}
    assert set(body["hit_rate"]) == {"gpu", "offload", "overall"}
    assert {"prefill_tokens_per_s", "load_gbps", "reloaded_tokens", "saved_prefill_s", "verdict"} <= set(body["worth"])
    assert all(v is not None for v in body["tokens"].values())


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


def test_summary_of_an_unknown_instance_is_a_404_with_a_message(client: Any, fed: list[dict[str, Any]]) -> None:
    r = client.get("/api/v1/instances/99/summary", params={"range": "15m"})
    assert r.status_code == 404 and "no instance 99" in r.text


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
