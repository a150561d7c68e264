"""The state machine as a pure function: pending -> firing -> resolved, for, cooldown, no data."""

from __future__ import annotations

from app.alerts.rule_io import RuleResult
from app.alerts.state import FIRING, PENDING, RESOLVED, OpenAlert, decide

P = {"for_s": 120.0, "cooldown_s": 600.0}
ON = RuleResult(True, 0.1)
OFF = RuleResult(False, 0.6)
UNKNOWN = RuleResult(None)


def test_opens_pending_then_fires_after_for() -> None:
    d = decide(None, ON, 1000.0, P)
    assert (d.action, d.to_state, d.at) == ("open", PENDING, 1000.0)
    cur = OpenAlert(PENDING, opened_at=1000.0, since=1000.0, last_eval=1000.0)
    assert decide(cur, ON, 1119.0, P).action == "update"
    d = decide(cur, ON, 1120.0, P)
    assert (d.action, d.to_state) == ("fire", FIRING)


def test_backdated_start_counts_data_time() -> None:
    d = decide(None, ON, 1000.0, P, active_since=870.0)
    assert (d.action, d.to_state, d.at) == ("open", FIRING, 870.0)  # held 130 s >= for
    d = decide(None, ON, 1000.0, P, active_since=950.0)
    assert (d.action, d.to_state, d.at) == ("open", PENDING, 950.0)
    d = decide(None, ON, 1000.0, P, active_since=2000.0)  # never in the future
    assert d.at == 1000.0


def test_for_zero_fires_at_once() -> None:
    d = decide(None, ON, 1000.0, {"for_s": 0.0})
    assert (d.action, d.to_state) == ("open", FIRING)


def test_pending_that_clears_resolves_without_firing_and_firing_resolves() -> None:
    pend = OpenAlert(PENDING, 1000.0, 1000.0, 1000.0)
    assert decide(pend, OFF, 1050.0, P).action == "resolve"
    firing = OpenAlert(FIRING, 1000.0, 1120.0, 1200.0)
    d = decide(firing, OFF, 1300.0, P)
    assert (d.action, d.to_state) == ("resolve", RESOLVED)


def test_cooldown_blocks_reopening() -> None:
    assert decide(None, ON, 1000.0, P, last_resolved_at=500.0).action == "none"
    assert decide(None, ON, 1100.0, P, last_resolved_at=500.0).action == "open"


def test_unknown_holds_state_until_nodata_timeout() -> None:
    firing = OpenAlert(FIRING, 1000.0, 1120.0, 1200.0)
    assert decide(firing, UNKNOWN, 1500.0, P, nodata_resolve_s=900.0).action == "none"
    d = decide(firing, UNKNOWN, 2101.0, P, nodata_resolve_s=900.0)
    assert d.action == "resolve" and "no data" in d.reason
    pend = OpenAlert(PENDING, 1000.0, 1000.0, 1000.0)
    assert decide(pend, UNKNOWN, 1500.0, P).action == "none"  # neither fires nor clears on no data
    assert decide(None, UNKNOWN, 1500.0, P).action == "none"
