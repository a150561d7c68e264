"""Alerts stay quiet when nothing is wrong: kvscope's own rollouts and A/B experiments are
expected (no notification, no banner, shown as expected), a baseline needs enough history, a tier
rule does not judge a tier the instance does not run, values carry their units."""

from __future__ import annotations

import re

from app.alerts import expected, units
from app.alerts.catalog import BY_NAME
from app.alerts.params import effective
from app.alerts.rule_io import TargetData
from app.alerts.series import SeriesMap
from kvcore.series import Series
from tests.app.alerts.receiver import Receiver
from tests.app.alerts.recorder import Recorder
from tests.app.alerts.rig import Rig
from tests.app.alerts.test_end_to_end import hook, rig  # noqa: F401  (fixtures: the real app on a fake clock)
from tests.app.alerts.traffic import HEALTHY, UNIQUE, Mix


def run(rule: str, data: TargetData, now: float, **kw: object):  # type: ignore[no-untyped-def]
    return BY_NAME[rule].func(data, now, {**effective(rule, {}), **kw})


def with_changes(data: TargetData, *windows: expected.ExpectedWindow) -> TargetData:
    return TargetData(data.series, data.host_series, {**data.info, "kvscope_changes": list(windows)}, data.events)


def test_a_baseline_from_twenty_minutes_of_data_is_still_learning() -> None:
    rec = Recorder(step=5.0)
    rec.run(1200, HEALTHY)
    rec.run(300, UNIQUE)  # a real drop, but against 15 minutes of history
    r = run("hit_rate_drop_overall", rec.data(), rec.t)
    assert r.active is None
    assert r.message.startswith("learning:") and "20 min of history" in r.message and "1 h" in r.message
    # with the history it needs, the same drop is judged
    rec2 = Recorder(step=60.0)
    rec2.run(2 * 3600, HEALTHY)
    rec2.step = 5.0
    rec2.run(300, UNIQUE)
    judged = run("hit_rate_drop_overall", rec2.data(), rec2.t)
    assert judged.active is True and "the 2 h before" in judged.message


def test_the_offload_rule_does_not_judge_an_instance_running_without_a_tier() -> None:
    rec = Recorder(step=60.0)
    rec.run(2 * 3600, HEALTHY)  # an offload tier served 10 % of prompt tokens ...
    cut = rec.t
    rec.step = 5.0
    rec.run(600, Mix(ext_hit=0.0))  # ... then the instance runs without one: no external lookups
    off = {"cache_config": {"block_size": "16", "kv_offloading_size": "None"}}
    r = run("hit_rate_drop_offload", without_lookups_after(rec.data(off), cut), rec.t)
    assert r.active is False and "no offload tier on this instance now" in r.message
    # configured but no longer hitting: judged (a tier that stopped hitting is what the rule is for)
    on = {"cache_config": {"block_size": "16", "kv_offloading_size": "4.0"}}
    assert run("hit_rate_drop_offload", rec.data(on), rec.t).active is True


def without_lookups_after(data: TargetData, cut: float) -> TargetData:
    """The external-lookup counters stop moving at `cut` (vLLM without a connector exports none)."""
    by_name = {}
    for name, got in data.series.by_name.items():
        if name.startswith("vllm:external_prefix_cache"):
            got = [Series(s.labels, [(t, v) for t, v in s.points if t <= cut]) for s in got]
        by_name[name] = got
    return TargetData(SeriesMap(by_name), data.host_series, data.info, data.events)


def test_a_running_change_holds_the_rule_and_the_baseline_restarts_after_it() -> None:
    rec = Recorder(step=60.0)
    rec.run(3 * 3600, HEALTHY)
    rec.step = 5.0
    start = rec.t
    rec.run(600, UNIQUE)
    running = expected.ExpectedWindow(1, start, None, "rollout", 7, "kvscope rollout #7")
    r = run("hit_rate_drop_overall", with_changes(rec.data(), running), rec.t)
    assert r.active is None and r.message == "expected: kvscope rollout #7 is changing this instance"
    # finished 60 s ago: the baseline restarts once it settled, so the rule is learning again
    done = expected.ExpectedWindow(1, start, rec.t - 60, "rollout", 7, "kvscope rollout #7")
    r2 = run("hit_rate_drop_overall", with_changes(rec.data(), done), rec.t)
    assert r2.active is None and r2.message.startswith("learning:")


def test_values_and_baselines_carry_their_units() -> None:
    assert BY_NAME["hit_rate_drop_overall"].format(0.1561) == "15.6 %"
    assert BY_NAME["hit_rate_drop_overall"].format(0.3359, "baseline") == "33.6 %"
    assert BY_NAME["ttft_p95"].format(2.3456) == "2,346 ms"
    assert BY_NAME["pinned_memory"].format(1.5 * 2**30) == "1.50 GiB"
    assert BY_NAME["offload_failures"].format(0.25, "baseline") == "0.25/s"
    assert units.fmt_value(None, units.RATIO) == "" and units.fmt_value(float("nan"), units.RATIO) == ""
    assert all(spec.units != ("", "") for spec in BY_NAME.values())


def _start_rollout(r: Rig, now: float) -> int:
    from app.storage import rollouts_store

    prof = rollouts_store.create_profile(r.ctx.engine, "quiet-test", {"args": []}, now)
    return rollouts_store.create_rollout(
        r.ctx.engine, instance_id=1, version_id=int(prof["version_id"]), lkg_version_id=None, payload={}, now=now
    )


def test_a_drop_during_a_kvscope_rollout_is_expected_no_notification_no_banner(
    rig: Rig,  # noqa: F811
    hook: Receiver,  # noqa: F811
) -> None:
    from app.storage import alerts_store

    # a TTFT budget the new profile's traffic breaks (0.6 s > 0.3 s), judged at once
    alerts_store.set_override(rig.ctx.engine, 1, "ttft_p95", {"budget_s": 0.3, "for_s": 0.0}, rig.t)
    rig.live(300, HEALTHY)
    rid = _start_rollout(rig, rig.t)
    rig.live(420, UNIQUE)  # the new profile: unique prompts, slower first tokens; kvscope did it
    drops = [a for a in rig.timeline[-1].alerts if a["state"] != "resolved"]
    assert drops == [], "a hit-rate baseline is no reference while kvscope changes the instance"
    ttft = [a for a in rig.evaluate("ttft_p95") if a["state"] == "firing"]
    assert len(ttft) == 1 and ttft[0]["expected"] == f"kvscope rollout #{rid}"
    assert ttft[0]["value_text"].endswith(" ms") and ttft[0]["baseline_text"] == "300 ms"
    assert [r.json()["event"] for r in hook.requests] == [], "no notification"
    assert "alerts firing" not in rig.client.get("/").text  # no red banner
    page = rig.client.get("/alerts").text
    assert "(expected: kvscope" in page and f"kvscope rollout #{rid}" in page
    rules = rig.client.get("/alerts/rules?instance=1").text
    # each rule says what it concluded at the last evaluation, values with their units
    assert "not judged</strong> at the last evaluation: expected: kvscope rollout" in rules
    assert re.search(
        r"holds</strong> at the last evaluation: TTFT p95 \d+ ms .*\(value [\d,]+ ms, baseline 300 ms\)", rules
    )


def test_expected_windows_cover_the_change_and_its_settling_time() -> None:
    w = expected.ExpectedWindow(3, 100.0, 200.0, "experiment", 2, "kvscope A/B experiment #2 (a vs b)")
    assert w.covers(100.0) and w.covers(200.0 + expected.SETTLE_S) and not w.covers(201.0 + expected.SETTLE_S)
    assert not w.covers(99.0)
    assert expected.settled_after([w], 150.0) == 200.0 + expected.SETTLE_S
    assert expected.settled_after([w], 50.0) is None
    running = expected.ExpectedWindow(3, 300.0, None, "rollout", 9, "kvscope rollout #9")
    assert expected.covering([w, running], 10_000.0) is running
    assert expected.from_info({"kvscope_changes": "garbage"}) == ()


def test_a_hybrid_model_with_a_slow_normal_ttft_does_not_fire_the_ttft_rule() -> None:
    """The demo's hybrid server: every prompt is a full prefill, its normal TTFT p95 is seconds.
    A fixed 2 s budget fired six minutes into every demo; the default budget is relative."""
    slow = Mix(ttft_s=4.5)
    young = Recorder(step=5.0)
    young.run(600, slow)
    r = run("ttft_p95", young.data(), young.t)
    assert r.active is None and "learning" in r.message and "4" in r.message
    rec = Recorder(step=60.0)
    rec.run(2 * 3600, slow)
    rec.step = 5.0
    rec.run(300, slow)
    normal = run("ttft_p95", rec.data(), rec.t)
    assert normal.active is False and normal.baseline is not None and normal.baseline > normal.value
    rec.run(300, Mix(ttft_s=30.0))  # a real regression: 6x its own normal
    worse = run("ttft_p95", rec.data(), rec.t)
    assert worse.active is True and "x its p95" in worse.message
    # an operator's SLO is still a fixed budget
    assert run("ttft_p95", rec.data(), rec.t, budget_s=60.0).active is False
