"""Rules as pure functions of (series, now): no database, no clock, no sleeping."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.alerts.catalog import BY_NAME
from app.alerts.params import effective
from app.alerts.rule_io import TargetData
from app.alerts.series import SeriesMap, window_increase
from kvcore.series import Series
from tests.app.alerts.recorder import Recorder
from tests.app.alerts.traffic import COLD, HEALTHY, UNIQUE, Mix, Server

GIB = 1024**3


def p(rule: str, **kw: object) -> dict[str, object]:
    return {**effective(rule, {}), **kw}


def run(rule: str, data: TargetData, now: float, **kw: object):  # type: ignore[no-untyped-def]
    return BY_NAME[rule].func(data, now, p(rule, **kw))


def history(server: Server | None = None, hours: float = 2.0) -> Recorder:
    """`hours` of healthy traffic scraped every 60 s, then 10 min scraped every 5 s."""
    rec = Recorder(server, step=60.0)
    rec.run(hours * 3600, HEALTHY)
    rec.step = 5.0
    rec.run(600, HEALTHY)
    return rec


def kinds(result) -> set[str]:  # type: ignore[no-untyped-def]
    return {h.kind for h in result.hints}


def test_window_increase_across_a_reset_counts_only_real_tokens() -> None:
    s = [Series({}, [(0, 100.0), (5, 150.0), (10, 20.0), (15, 70.0)])]
    w = window_increase(s, 0, 15)
    assert w.value == pytest.approx(50 + 20 + 50)
    assert w.resets == (10,)
    # anchored on the last point before the window start
    assert window_increase(s, 5, 15).value == pytest.approx(70)
    assert window_increase(s, 20, 30).value is None


def test_healthy_traffic_does_not_fire_and_reports_vllm_hit_rate() -> None:
    rec = history()
    r = run("hit_rate_drop_overall", rec.data(), rec.t)
    assert r.active is False
    assert r.value == pytest.approx(0.6)  # (local_cache_hit + external_kv_transfer) / prompt_tokens
    assert r.baseline == pytest.approx(0.6)
    g = run("hit_rate_drop_gpu", rec.data(), rec.t)
    assert (g.active, g.value) == (False, pytest.approx(0.5))
    o = run("hit_rate_drop_offload", rec.data(), rec.t)
    assert (o.active, o.value) == (False, pytest.approx(0.1 / 0.5))


def test_unique_prompts_fire_when_the_window_rate_crosses_both_margins() -> None:
    rec = history()
    switch = rec.t
    # threshold = min(0.6 - 0.10, 0.6 x 0.75) = 0.45; window rate = 0.6 (300 - tau) / 300 -> tau > 75 s
    for tau in (30, 60, 75):
        rec.run(switch + tau - rec.t, UNIQUE)
        r = run("hit_rate_drop_overall", rec.data(), rec.t)
        assert r.value == pytest.approx(0.6 * (300 - tau) / 300, abs=1e-9)
        assert r.active is False, tau
    rec.run(5, UNIQUE)
    r = run("hit_rate_drop_overall", rec.data(), rec.t)
    assert r.active is True
    assert r.value == pytest.approx(0.6 * 220 / 300)
    assert kinds(r) == {"workload_shift"}
    assert "share fewer prefixes" in r.hints[0].message


def test_restart_in_the_window_is_not_a_false_drop() -> None:
    rec = history()
    rec.restart()  # counters go back to zero, traffic and hit mix unchanged
    rec.run(240, HEALTHY)
    r = run("hit_rate_drop_overall", rec.data(), rec.t)
    assert r.active is False
    assert r.value == pytest.approx(0.6)  # reset-corrected: no negative or doubled tokens


def test_cold_cache_after_restart_gets_the_restart_hint_not_workload_shift() -> None:
    rec = history()
    rec.restart()
    rec.run(180, COLD)
    r = run("hit_rate_drop_overall", rec.data(), rec.t)
    assert r.active is True
    assert "restart" in kinds(r)
    assert "workload_shift" not in kinds(r)
    # still explained by the restart after the reset left the 5-minute window
    rec.run(200, HEALTHY)
    r = run("hit_rate_drop_overall", rec.data(), rec.t)
    assert r.active is True and "restart" in kinds(r) and "workload_shift" not in kinds(r)


def test_request_rate_and_prompt_length_shift_are_named() -> None:
    rec = history()
    rec.run(300, Mix(rps=6.0, prompt_len=500.0, gpu_hit=0.1, ext_hit=0.0))
    r = run("hit_rate_drop_overall", rec.data(), rec.t)
    assert r.active is True
    (hint,) = [h for h in r.hints if h.kind == "workload_shift"]
    assert "request rate 2.00/s -> 6.00/s (+200%)" in hint.message
    assert "mean prompt length 2000 -> 500 tokens (-75%)" in hint.message


def test_prompt_length_mix_shift_with_the_same_mean_is_named() -> None:
    rec = history()
    # half short, half long prompts: the mean stays 2000 tokens, the mix does not
    rec.run(300, Mix(gpu_hit=0.1, ext_hit=0.0, lengths=((500.0, 0.5), (3500.0, 0.5))))
    r = run("hit_rate_drop_overall", rec.data(), rec.t)
    (hint,) = [h for h in r.hints if h.kind == "workload_shift"]
    assert "mean prompt length" not in hint.message
    assert "prompt length mix moved (total variation 1.00)" in hint.message
    assert "prompts of 1024-2048 tokens 100% -> 0% of requests" in hint.message


def test_config_change_event_is_a_hint() -> None:
    rec = history()
    msg = "cache config changed: block_size 16 -> 64"
    rec.events.insert(0, {"ts": rec.t + 10, "kind": "config_change", "message": msg})
    rec.run(300, UNIQUE)
    r = run("hit_rate_drop_overall", rec.data(), rec.t)
    assert "config_change" in kinds(r)
    assert "workload_shift" not in kinds(r)  # explained: no fallback guess


def test_hybrid_block_size_larger_than_shared_prefixes() -> None:
    rec = history(Server(block_size="1920"))
    rec.run(300, UNIQUE)
    info = {"cache_config": {"block_size": "1920", "mamba_cache_mode": "align", "kv_offloading_size": "None"}}
    r = run("hit_rate_drop_overall", rec.data(info), rec.t)
    assert "hybrid_block_size" in kinds(r)
    (h,) = [h for h in r.hints if h.kind == "hybrid_block_size"]
    assert "1920" in h.message and "~1200" in h.message  # 0.6 x 2000 cached tokens per request
    dense = run("hit_rate_drop_overall", rec.data({"cache_config": {"block_size": "16"}}), rec.t)
    assert "hybrid_block_size" not in kinds(dense)


def test_offload_saturation_and_silent_connector_hints() -> None:
    rec = history()
    rec.run(300, replace(HEALTHY, ext_hit=0.0, gpu_hit=0.4, alloc_failures_per_s=0.5))
    r = run("hit_rate_drop_overall", rec.data(), rec.t)
    assert {"offload_saturated", "connector_silent"} <= kinds(r)
    o = run("hit_rate_drop_offload", rec.data(), rec.t)
    assert o.active is True and o.value == 0.0


def test_unique_prompts_are_not_blamed_on_the_connector() -> None:
    rec = history()
    rec.run(600, UNIQUE)  # the whole window unique: GPU and offload tier both find nothing
    for rule in ("hit_rate_drop_overall", "hit_rate_drop_offload"):
        r = run(rule, rec.data(), rec.t)
        assert r.active is True and kinds(r) == {"workload_shift"}, (rule, r.hints)


def test_too_little_volume_or_history_is_unknown_not_ok() -> None:
    rec = Recorder(step=5.0)
    rec.run(600, Mix(rps=0.001))
    assert run("hit_rate_drop_overall", rec.data(), rec.t).active is None
    rec2 = Recorder(step=5.0)
    rec2.run(200, HEALTHY)  # nothing before the window: no baseline
    r = run("hit_rate_drop_overall", rec2.data(), rec2.t)
    assert r.active is None and "baseline" in r.message


def test_floor_rule() -> None:
    rec = history()
    rec.run(300, Mix(gpu_hit=0.05, ext_hit=0.0))
    r = run("hit_rate_floor", rec.data(), rec.t, floor=0.2)
    assert r.active is True and r.value == pytest.approx(0.05)
    assert run("hit_rate_floor", rec.data(), rec.t, floor=0.01).active is False


def test_instance_down_agent_stale() -> None:
    now = 10_000.0
    up = {"host_last_push": now - 5, "last_ok": now - 5, "last_scrape": now - 5, "healthy": True}
    assert run("instance_down", TargetData(info=up), now).active is False
    down = {**up, "last_ok": now - 200, "last_error": "connection refused"}
    r = run("instance_down", TargetData(info=down), now)
    assert r.active is True and "connection refused" in r.message and r.since == now - 200 + 60
    sick = {**up, "healthy": False}
    assert run("instance_down", TargetData(info=sick), now).active is True
    stale = {**down, "host_last_push": now - 500}
    assert run("instance_down", TargetData(info=stale), now).active is None  # agent_stale's job
    a = run("agent_stale", TargetData(info={"host": "rig1", "last_push": now - 500}), now)
    assert a.active is True and a.since == now - 500 + 120
    assert run("agent_stale", TargetData(info={"host": "rig1", "last_push": now - 5}), now).active is False


def _host(now: float, **gauges: float) -> TargetData:
    names = {
        "avail": "kvscope:host_memory_available_bytes",
        "total": "kvscope:host_memory_total_bytes",
        "limit": "kvscope:cgroup_memory_limit_bytes",
        "current": "kvscope:cgroup_memory_current_bytes",
        "pinned": "kvscope:pinned_offload_file_bytes",
    }
    by = {names[k]: [Series({}, [(now - 10, v)])] for k, v in gauges.items()}
    return TargetData(series=SeriesMap(by), info={"instances": [{"cache_config": {"kv_offloading_size": "8"}}]})


def test_pinned_memory_headroom() -> None:
    now = 5000.0
    ok = _host(now, avail=40 * GIB, total=64 * GIB)
    assert run("pinned_memory", ok, now).active is False
    low = _host(now, avail=1.5 * GIB, total=64 * GIB, pinned=8 * GIB)
    r = run("pinned_memory", low, now)
    assert r.active is True and "1.5 GiB" in r.message and "offload buffer 8.0 GiB" in r.message
    # the cgroup limit is tighter than the host
    cg = _host(now, avail=40 * GIB, total=64 * GIB, limit=16 * GIB, current=15.5 * GIB)
    r = run("pinned_memory", cg, now)
    assert r.active is True and "cgroup" in r.message
    plain = _host(now, avail=1.5 * GIB, total=64 * GIB).series
    no_offload = TargetData(series=plain, info={"instances": [{"cache_config": {"kv_offloading_size": "None"}}]})
    assert run("pinned_memory", no_offload, now).active is False
    # a leftover /dev/shm offload file still holds RAM: counts as offload on
    leftover = TargetData(series=low.series, info=no_offload.info)
    assert run("pinned_memory", leftover, now).active is True
    assert run("pinned_memory", TargetData(), now).active is None


def test_offload_thrash_and_failures() -> None:
    rec = history()
    rec.run(600, replace(HEALTHY, store_bytes_per_s=50e6, ext_hit=0.0))
    r = run("offload_thrash", rec.data(), rec.t)
    assert r.active is True and r.value == 0.0
    rec2 = history()
    rec2.run(600, replace(HEALTHY, store_bytes_per_s=50e6))  # loads 0.1 x 4000 tok/s x 147 kB >> 2% of stores
    assert run("offload_thrash", rec2.data(), rec2.t).active is False
    assert run("offload_failures", rec2.data(), rec2.t).active is False
    rec2.run(60, replace(HEALTHY, alloc_failures_per_s=1.0))
    f = run("offload_failures", rec2.data(), rec2.t)
    assert f.active is True and f.value == pytest.approx(60)


def test_ttft_p95_budget() -> None:
    rec = history()
    r = run("ttft_p95", rec.data(), rec.t)
    assert r.active is False
    assert 0.1 < r.value <= 0.25  # all requests in the (0.1, 0.25] bucket
    rec.run(300, replace(HEALTHY, ttft_s=3.0))
    r = run("ttft_p95", rec.data(), rec.t)
    assert r.active is True and 2.5 < r.value <= 5.0
    quiet = Recorder(step=5.0)
    quiet.run(300, Mix(rps=0.01))
    assert run("ttft_p95", quiet.data(), quiet.t).active is None
