"""Derived series: quantiles, ratios, sums, ceilings, offload config parsing, rollup-tier
evaluation, and the "is offload worth it?" verdicts."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.derived.grid import Grid, make_grid
from app.derived.grid_math import add, counter_rate, gauge_values, range_increase
from app.derived.panels import offload_capacity_bytes, offload_size_bytes
from app.derived.pcie import link_ceiling_gbps
from app.derived.series_reader import TieredSeries
from app.derived.worth import compute_worth
from app.storage.rollup_buckets import Bucket
from kvcore.series import histogram_quantile, ratio


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    b = {0.1: 10.0, 0.2: 30.0, 0.4: 40.0, math.inf: 40.0}
    assert histogram_quantile(0.5, b) == pytest.approx(0.15)  # rank 20: half-way in (0.1, 0.2]
    assert histogram_quantile(0.25, b) == pytest.approx(0.1)  # rank 10: top of the first bucket
    assert histogram_quantile(0.1, b) == pytest.approx(0.04)  # first bucket starts at 0
    assert histogram_quantile(0.99, {0.1: 1.0, math.inf: 10.0}) == 0.1  # rank in +Inf: highest finite bound
    assert histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None  # no observations: no quantile
    assert histogram_quantile(0.5, {0.1: 5.0}) is None  # no +Inf bucket
    # a non-monotonic scrape race is made monotonic, not turned into nonsense
    assert histogram_quantile(0.5, {0.1: 10.0, 0.2: 8.0, math.inf: 20.0}) == pytest.approx(0.1)
    assert histogram_quantile(0.75, {0.1: 10.0, 0.2: 8.0, math.inf: 20.0}) == pytest.approx(0.2)


def test_ratio_is_a_gap_without_traffic_and_sums_keep_partial_data() -> None:
    assert ratio([1.0, 0.0, None, 3.0], [2.0, 0.0, 1.0, None], 100.0) == [50.0, None, None, None]
    assert add([[1.0, None, None], [2.0, 5.0, None]]) == [3.0, 5.0, None]


def test_pcie_ceilings() -> None:
    assert link_ceiling_gbps(4, 16) == pytest.approx(31.504)
    assert link_ceiling_gbps(5.0, 16.0) == pytest.approx(63.008)
    assert link_ceiling_gbps(None, 16) is None and link_ceiling_gbps(9, 16) is None and link_ceiling_gbps(3, 0) is None


def test_offload_size_from_cache_config() -> None:
    assert offload_size_bytes({"cache_config": {"kv_offloading_size": "8"}}) == 8 * 2**30
    assert offload_size_bytes({"cache_config": {"kv_offloading_size": "None"}}) is None
    assert offload_size_bytes({"cache_config": {"kv_offloading_size": "garbage"}}) is None
    assert offload_size_bytes({"cache_config": None}) is None
    assert (
        offload_capacity_bytes(
            {
                "offload_config": {"cpu_num_chunks": "100", "cpu_kv_bytes_per_chunk": "1024"},
                "cache_config": {"kv_offloading_size": "8"},
            }
        )
        == 102_400
    )
    assert (
        offload_capacity_bytes(
            {"offload_config": {"cpu_num_chunks": "x"}, "cache_config": {"kv_offloading_size": "0.5"}}
        )
        == 2**29
    )


@pytest.mark.parametrize("span", [900.0, 3600.0, 86400.0, 7 * 86400.0, 30 * 86400.0, 400 * 86400.0])
@pytest.mark.parametrize("tier", ["raw", "1m", "1h"])
def test_grid_never_exceeds_one_point_per_pixel(span: float, tier: str) -> None:
    g = make_grid(1_800_000_000.0 - span, 1_800_000_000.0, tier, 1600)
    assert len(g.times) <= 1601
    assert all(t % g.step == 0 for t in g.times)


def _buckets(incs: list[float], res: float = 60.0, t0: float = 1_800_000_000.0 - 3600) -> TieredSeries:
    bs = [Bucket(t0 + i * res, 60, 1.0, 3.0, 120.0, 2.0, inc) for i, inc in enumerate(incs)]
    return TieredSeries(1, "x_total", {}, "counter", "1m", res, [], bs)


def test_rollup_tier_rate_is_increase_over_covered_time() -> None:
    s = _buckets([60.0, 120.0, 0.0, 240.0])
    t0 = s.buckets[0].ts
    g = Grid(t0, t0 + 240, 120.0, "1m", [t0 + 120, t0 + 240])
    assert counter_rate(s, g) == [pytest.approx(180 / 120), pytest.approx(240 / 120)]
    # a missing minute is not counted as zero traffic
    s2 = TieredSeries(1, "x_total", {}, "counter", "1m", 60.0, [], [s.buckets[0], s.buckets[3]])
    assert counter_rate(s2, g) == [pytest.approx(1.0), pytest.approx(4.0)]
    assert gauge_values(s, g) == [pytest.approx(2.0), pytest.approx(2.0)]
    assert gauge_values(s, g, "max") == [3.0, 3.0]
    assert range_increase(s, t0, t0 + 240) == 420.0


class _Scope:
    """The fetch interface of app.derived.panels.Scope, over fixed series."""

    def __init__(self, series: dict[str, list[TieredSeries]], offload: str = "4") -> None:
        self.series = series
        self.instance = {"cache_config": {"kv_offloading_size": offload}, "offload_config": {}}
        self.grid = Grid(0.0, 100.0, 1.0, "raw", [])

    def fetch(self, names: list[str], host: bool = False) -> dict[str, list[TieredSeries]]:
        return {n: self.series.get(n, []) for n in names}

    def range_increases(self, names: list[str], start: float, end: float) -> dict[str, list[Any]]:
        return {n: [(s.labels, range_increase(s, start, end)) for s in self.series.get(n, [])] for n in names}


def _raw(name: str, v0: float, v1: float, labels: dict[str, str] | None = None) -> TieredSeries:
    return TieredSeries(1, name, labels or {}, "counter", "raw", 0.0, [(0.0, v0), (100.0, v1)], [])


def _worth(offload: str = "4", **incs: float) -> Any:
    series: dict[str, list[TieredSeries]] = {}
    by_source = []
    for src in ("external_kv_transfer", "local_compute", "local_cache_hit"):
        if src in incs:
            by_source.append(_raw("vllm:prompt_tokens_by_source_total", 0, incs[src], {"source": src}))
    series["vllm:prompt_tokens_by_source_total"] = by_source
    for key, name in (
        ("load_b", "vllm:kv_offload_load_bytes_total"),
        ("load_t", "vllm:kv_offload_load_time_total"),
        ("store_b", "vllm:kv_offload_store_bytes_total"),
        ("prefill_s", "vllm:request_prefill_time_seconds_sum"),
        ("ttft_s", "vllm:time_to_first_token_seconds_sum"),
        ("queue_s", "vllm:request_queue_time_seconds_sum"),
    ):
        if key in incs:
            series[name] = [_raw(name, 0, incs[key])]
    cached = [
        _raw("vllm:prompt_tokens_cached_by_source_total", 0, incs[f"cached_{src}"], {"source": src})
        for src in ("device", "host", "disk", "external_unspecified")
        if f"cached_{src}" in incs
    ]
    series["vllm:prompt_tokens_cached_by_source_total"] = cached
    return compute_worth(_Scope(series, offload=offload))  # type: ignore[arg-type]


def test_worth_figures_and_verdicts() -> None:
    w = _worth(
        external_kv_transfer=110_000,
        local_compute=23_000,
        local_cache_hit=5,
        load_b=12.6e9,
        load_t=1.0,
        store_b=20e9,
        prefill_s=1.0,
    )
    assert w.load_gbps == pytest.approx(12.6)
    assert w.load_tokens_per_s == pytest.approx(110_000)
    assert w.prefill_tokens_per_s == pytest.approx(23_000)
    assert w.saved_seconds == pytest.approx(110_000 / 23_000 - 1.0)
    assert w.thrash_ratio == pytest.approx((20e9 - 12.6e9) / 20e9)
    assert w.tone == "good" and w.verdict.startswith("Worth it")
    slow = _worth(external_kv_transfer=1000, local_compute=23_000, load_b=1e9, load_t=1.0, prefill_s=1.0)
    assert slow.tone == "bad" and "Costs more" in slow.verdict
    idle = _worth(external_kv_transfer=0, local_compute=1000, store_b=5e9, load_b=0, load_t=0)
    assert idle.tone == "bad" and "Not earning its RAM" in idle.verdict
    off = compute_worth(_Scope({}, offload="None"))  # type: ignore[arg-type]
    assert off.tone == "neutral" and "off" in off.verdict


def test_a_disk_connector_is_an_offload_tier_named_by_what_it_is() -> None:
    """vLLM's ExampleConnector (a disk store) with no CPU offload size: reloads come through
    external_kv_transfer and prompt_tokens_cached_by_source{external_unspecified}."""
    w = _worth(
        offload="None",
        external_kv_transfer=2048,
        local_compute=5504,
        cached_external_unspecified=2048,
        prefill_s=0.5,
    )
    assert w.offload_configured and w.tier == "external connector"
    assert w.prefill_tokens_per_s == pytest.approx(5504 / 0.5) and w.prefill_basis == "measured"
    # no kv_offload_* time from this connector: the load time is inside prefill, the saving an upper bound
    assert w.saved_seconds == pytest.approx(2048 / (5504 / 0.5))
    assert w.tone == "good" and "external connector" in w.verdict and "at most" in w.verdict
    assert "off" not in w.verdict.split(":")[0]
    disk = _worth(offload="None", external_kv_transfer=100, local_compute=100, cached_disk=100, prefill_s=1.0)
    assert disk.tier == "disk"
    both = _worth(external_kv_transfer=100, local_compute=100, cached_host=60, cached_disk=40, prefill_s=1.0)
    assert both.tier == "CPU + disk"


def test_prefill_speed_is_estimated_where_vllm_lacks_the_prefill_histogram_and_says_so() -> None:
    base = {"external_kv_transfer": 10_000.0, "local_compute": 20_000.0, "load_b": 1e9, "load_t": 0.05}
    est = _worth(**base, ttft_s=3.0, queue_s=1.0)
    assert est.prefill_tokens_per_s == pytest.approx(20_000 / 2.0)
    assert est.prefill_basis == "estimated from TTFT - queue time"
    assert est.saved_seconds == pytest.approx(10_000 / 10_000 - 0.05)
    assert "estimated from TTFT - queue time" in est.verdict
    ttft_only = _worth(**base, ttft_s=4.0)
    assert ttft_only.prefill_tokens_per_s == pytest.approx(5_000.0)
    assert "includes queueing" in ttft_only.verdict
    measured = _worth(**base, ttft_s=4.0, queue_s=1.0, prefill_s=1.0)
    assert measured.prefill_basis == "measured" and "estimated" not in measured.verdict
    none = _worth(**base)
    assert none.prefill_tokens_per_s is None and none.saved_seconds is None and none.tone == "neutral"
    assert "cannot be estimated" in none.verdict


def test_an_lmcache_engine_is_an_offload_tier_named_lmcache() -> None:
    series = {
        "vllm:prompt_tokens_by_source_total": [
            _raw("vllm:prompt_tokens_by_source_total", 0, 300, {"source": "external_kv_transfer"}),
            _raw("vllm:prompt_tokens_by_source_total", 0, 600, {"source": "local_compute"}),
        ],
        "lmcache:num_hit_tokens_total": [_raw("lmcache:num_hit_tokens_total", 0, 300)],
        "vllm:request_prefill_time_seconds_sum": [_raw("vllm:request_prefill_time_seconds_sum", 0, 0.1)],
    }
    w = compute_worth(_Scope(series, offload="None"))  # type: ignore[arg-type]
    assert w.tier == "LMCache" and w.offload_configured and "LMCache reloads" in w.verdict
