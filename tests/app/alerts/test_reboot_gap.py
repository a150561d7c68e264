"""The health rules count a silence from the app's own start: a reboot stops the app and the rig
together, and the first evaluation after it must not alert on the gap the app could not watch
(tests/rig/test_reboot.py runs the whole reboot)."""

from __future__ import annotations

from app.alerts.catalog import BY_NAME
from app.alerts.params import effective
from app.alerts.rule_io import RuleResult, TargetData

NOW = 50_000.0


def run(rule: str, info: dict[str, object], now: float = NOW) -> RuleResult:
    return BY_NAME[rule].func(TargetData(info=info), now, effective(rule, {}, None))


def test_an_agent_silent_only_while_the_app_was_down_is_not_stale_yet() -> None:
    # the last push is 10 minutes old, but the app started 30 s ago: it has watched 30 s of silence
    info = {"host": "rig1", "last_push": NOW - 600, "app_started_at": NOW - 30}
    r = run("agent_stale", info)
    assert r.active is None and "app started 30 s ago" in r.message
    # still silent stale_after_s (120 s) after the app's start: now it is stale, back-dated as before
    later = run("agent_stale", info, NOW + 100)
    assert later.active is True and later.since == NOW - 600 + 120
    # a push after the app's start is judged as always
    assert run("agent_stale", {**info, "last_push": NOW - 5}).active is False


def test_an_instance_last_scraped_before_the_app_started_is_not_down_yet() -> None:
    info = {"host_last_push": NOW - 2, "last_ok": NOW - 600, "last_scrape": NOW - 2, "app_started_at": NOW - 20}
    r = run("instance_down", info)
    assert r.active is None and "app started 20 s ago" in r.message
    assert run("instance_down", info, NOW + 60).active is True  # down_after_s (60 s) of the app's own watch


def test_without_a_start_time_the_rules_judge_as_before() -> None:
    assert run("agent_stale", {"host": "rig1", "last_push": NOW - 600}).active is True
    info = {"host_last_push": NOW - 2, "last_ok": NOW - 600, "last_scrape": NOW - 2}
    assert run("instance_down", info).active is True
