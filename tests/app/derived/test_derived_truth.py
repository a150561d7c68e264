"""The truth test: every plotted rate and ratio equals an independent PromQL-style computation.

A recorded sequence of scrapes (jittered gaps, a counter restart half-way) goes through the real
ingest API (once per session, tests/fed_databases.py: the module reads a copy); the instance charts
are read back from /api/v1/instances/{id}/charts/{key}; each plotted value is recomputed by
tests/app/derived/promql_oracle.py from the recorded scrapes themselves.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest

from app.derived.grid import MIN_RATE_WINDOW_S
from tests.app.dashboard.recorded import opened_app, recorded_batches
from tests.app.derived import promql_oracle as o
from tests.fed_databases import Feed

TOL = 1e-9


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=TOL, abs_tol=TOL)


T0 = 1_800_000_000.0


# the recorded scrapes through the ingest API, fed once per session (for every xdist worker)
RECORDED = Feed("truth", lambda: recorded_batches(T0 - 4000, 600, interval=5.0, reset_at=330))


@pytest.fixture(scope="module")
def fed(tmp_path_factory: Any, fed_databases: Any) -> Any:
    """The module's app, opened on a copy of the fed database (an app restarted on that data),
    its clock where pushing the batches left it."""
    from tests.conftest import FakeClock

    batches = RECORDED.batches()
    data_dir = tmp_path_factory.mktemp("truth")
    fed_databases.copy_sqlite(RECORDED, data_dir / "kvscope.db")
    with opened_app(data_dir, FakeClock(batches[-1]["sent_at"] + 3)) as (app, client):
        yield app, client, batches


@pytest.fixture
def client(fed: Any) -> Any:
    return fed[1]


@pytest.fixture
def recorded(fed: Any) -> list[dict[str, Any]]:
    return fed[2]


@pytest.fixture
def app(fed: Any) -> Any:
    return fed[0]


def _chart(client: Any, key: str, start: float, end: float, **extra: Any) -> dict[str, Any]:
    r = client.get(f"/api/v1/instances/1/charts/{key}", params={"range": "custom", "start": start, "end": end, **extra})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["figure"] is not None, body["empty"]
    return body


def _traces(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in body["figure"]["data"] if t["name"] != "events"}


def _check(trace: dict[str, Any], expect: Callable[[float], float | None]) -> int:
    compared = 0
    for x, y in zip(trace["x"], trace["y"], strict=True):
        want = expect(x / 1000.0)
        assert _close(y, want), f"{trace['name']} at {x}: plotted {y}, oracle {want}"
        compared += y is not None
    return compared


@pytest.mark.parametrize("span", [1800.0, 3000.0])
def test_every_plotted_rate_and_ratio_matches_the_oracle(
    client: Any, recorded: list[dict[str, Any]], span: float
) -> None:
    end = recorded[-1]["scrapes"][0]["ts"] - 7.3
    start = end - span
    series = lambda name, match=None: o.recorded_series(recorded, name, match)  # noqa: E731
    checked: dict[str, int] = {}

    tokens = _chart(client, "tokens", start, end)
    w = tokens["figure"]["layout"]["meta"]["rate_window_s"]
    assert tokens["tier"] == "raw" and w >= tokens["step"]
    stamps = [b["scrapes"][0]["ts"] for b in recorded]
    max_gap = max(b - a for a, b in itertools.pairwise(stamps))
    min_gap = min(b - a for a, b in itertools.pairwise(stamps))
    # Grafana's $__rate_interval: max(step + scrape interval, 4 x scrape interval)
    assert w >= 4 * min_gap and w >= tokens["step"] + min_gap and w >= MIN_RATE_WINDOW_S
    assert w <= max(tokens["step"] + max_gap, 4 * max_gap, MIN_RATE_WINDOW_S)
    tr = _traces(tokens)
    for name, src in (
        ("GPU prefix-cache hit", "local_cache_hit"),
        ("CPU reload", "external_kv_transfer"),
        ("recompute", "local_compute"),
    ):
        s = series("vllm:prompt_tokens_by_source_total", {"source": src})
        checked[name] = _check(tr[name], lambda t, s=s: o.sum_rate(s, t, w))

    hit = _traces(_chart(client, "hitrates", start, end))
    pairs = {
        "GPU prefix cache": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
        "offload tier": ("vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total"),
        "overall": ("vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_total"),
    }
    for name, (num, den) in pairs.items():
        a, b = series(num), series(den)
        checked[name] = _check(hit[name], lambda t, a=a, b=b: o.divide(o.sum_rate(a, t, w), o.sum_rate(b, t, w), 100.0))

    xfer = _traces(_chart(client, "transfer", start, end))
    for name, metric in (
        ("load CPU->GPU", "vllm:kv_offload_load_bytes_total"),
        ("store GPU->CPU", "vllm:kv_offload_store_bytes_total"),
    ):
        s = series(metric)
        checked[name] = _check(xfer[name], lambda t, s=s: o.divide(o.sum_rate(s, t, w), 1e9))

    lat = _traces(_chart(client, "latency", start, end))
    ttft = series("vllm:time_to_first_token_seconds_bucket")
    itl = series("vllm:inter_token_latency_seconds_bucket")
    for q in (0.5, 0.95, 0.99):
        name = f"TTFT p{round(q * 100)}"
        checked[name] = _check(lat[name], lambda t, q=q: _ms(o.quantile_of_rates(ttft, q, t, w)))
    for q in (0.5, 0.95):
        name = f"ITL p{round(q * 100)}"
        checked[name] = _check(lat[name], lambda t, q=q: _ms(o.quantile_of_rates(itl, q, t, w)))
    pre = series("vllm:num_preemptions_total")
    checked["preemptions"] = _check(lat["preemptions"], lambda t: o.sum_rate(pre, t, w))

    tiers = _chart(client, "tiers", start, end)
    fill = _traces(tiers)["CPU tier fill estimate (derived)"]
    stored = next(iter(series("vllm:kv_offload_store_bytes_total").values()))
    cap = 4 * 2**30
    look = max(tiers["step"], 10.0)  # scrapes are ~5 s apart: the last one is always within this
    checked["fill"] = _check(fill, lambda t: _fill(o.last_at(stored, t, look), cap))

    # nothing trivially passed: every trace had most of its points compared
    for name, n in checked.items():
        assert n >= 0.8 * tokens["points"], f"{name}: only {n} points compared"


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _fill(v: float | None, cap: float) -> float | None:
    return None if v is None else min(100.0, 100.0 * v / cap)


def test_rates_across_the_restart_are_never_negative(client: Any, recorded: list[dict[str, Any]]) -> None:
    t_reset = recorded[330]["scrapes"][0]["ts"]
    body = _chart(client, "tokens", t_reset - 300, t_reset + 300)
    ys = [y for tr in body["figure"]["data"] if tr["name"] != "events" for y in tr["y"] if y is not None]
    assert ys and min(ys) >= 0
    # the restart shows as an event marker on the chart
    events = [tr for tr in body["figure"]["data"] if tr["name"] == "events"]
    assert events and any("counter_reset" in h for h in events[0]["hovertext"])


def test_rollup_tier_rates_match_the_oracle(client: Any, recorded: list[dict[str, Any]], app: Any) -> None:
    """After the rollup job, the 1-minute tier's rates equal the increase of the recorded samples
    that fell in the covered minutes, divided by the time those minutes span."""
    from app.web.jobs import run_job_now

    ctx = app.state.ctx
    run_job_now(ctx, "rollups", now=recorded[-1]["sent_at"] + 600)
    end = recorded[-1]["scrapes"][0]["ts"]
    start = end - 2400
    body = _chart(client, "tokens", start, end, tier="1m")
    assert body["tier"] == "1m"
    step = body["step"]
    s = next(
        iter(o.recorded_series(recorded, "vllm:prompt_tokens_by_source_total", {"source": "local_compute"}).values())
    )

    def minute_rate(t: float) -> float | None:
        lo = t - step
        gained = 0.0
        minutes: set[int] = set()
        for i, (ts, v) in enumerate(s):
            if lo <= ts < t:
                minutes.add(int(ts // 60))
                if i:
                    prev = s[i - 1][1]
                    gained += v - prev if v >= prev else v
        return gained / (len(minutes) * 60.0) if minutes else None

    n = _check(_traces(body)["recompute"], minute_rate)
    assert n >= 30
