"""A simulated reboot: app, agent and vLLM all SIGKILLed at once (a power cut), then the units'
commands started again. Every sample from before and after is stored once, and no alert opens
because of the reboot itself: the gap, the counters starting over and the cold cache are the
reboot, not a drop of the prefix hit rate, a dead instance or a silent agent.

Rule windows are shortened through settings (what a user can do) so a gap of seconds is longer
than every threshold; the end of the test shows the same rules do fire on a real silence."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.rig.units import HOST_TICK, VLLM_TICK, Rig, rig_units
from tests.waits import wait_until

pytestmark = pytest.mark.slow
STALE_S = 10.0
ALERT_ENV = {
    "KVSCOPE_ALERT_EVAL_INTERVAL_S": "1",
    "KVSCOPE_ALERT_RULES": json.dumps(
        {
            "agent_stale": {"stale_after_s": STALE_S},
            "instance_down": {"down_after_s": STALE_S, "agent_stale_s": STALE_S},
            # windows shortened in proportion to the defaults (300 s window, for 120 s): a cold
            # cache refilling after the restart is a real, short dip (docs/alerts.md: it carries
            # the restart hint when it lasts); the gap and the counters starting over are no drop
            "hit_rate_drop_overall": {
                "window_s": 20,
                "baseline_s": 600,
                "min_history_s": 10,
                "for_s": 8,
                "min_baseline_tokens": 5000,
            },
            "hit_rate_drop_gpu": {
                "window_s": 20,
                "baseline_s": 600,
                "min_history_s": 10,
                "for_s": 8,
                "min_baseline_tokens": 5000,
            },
        }
    ),
}
# a few documents queried in turn: once warm nearly every prompt token is a prefix hit
DOCS = [" ".join(f"manual {d} chapter {i} covers the cache." for i in range(25)) for d in range(4)]


def _traffic(rig: Rig, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        rig.request(DOCS[n % len(DOCS)] + f" question {n}?")
        stop.wait(0.05)


def _alerts(rig: Rig) -> list[dict[str, Any]]:
    return list(rig.api("/api/v1/alerts?state=all")["alerts"])


def test_a_reboot_loses_no_sample_stores_none_twice_and_fires_no_alert(tmp_path: Path) -> None:
    stop = threading.Event()
    with rig_units(tmp_path, app_env=ALERT_ENV) as rig, rig.watching_spool():
        wait_until(rig.sim_healthy, "the supervised sim healthy", 90)
        traffic = threading.Thread(target=_traffic, args=(rig, stop), daemon=True)
        traffic.start()
        try:
            rig.wait_stored(25, "25 ticks of traffic before the reboot")
            assert _alerts(rig) == [], _alerts(rig)

            # power cut: everything at once, the agent's unsent batches stay in its spool
            server = rig.sim_pid()
            assert server is not None
            t_off = time.time()
            os.killpg(server, signal.SIGKILL)
            rig.app.kill9()
            rig.agent.kill9()
            for f in (rig.tmp / "sim").glob("*"):  # /dev/shm and the like are empty after a reboot
                f.unlink()
            wait_until(lambda: time.time() - t_off > 2 * STALE_S, "a gap longer than every threshold", 30)

            t_on = time.time()
            rig.app.start()
            wait_until(rig.dashboard_serves, "the dashboard", 120, interval=0.1)
            t_dashboard = time.time()
            # the agent's unit comes up after the app's (network-online, the GPU driver, a slower
            # box): the app evaluates its rules before the agent's first push
            # (its alert job runs every second from its start: two runs before the agent starts)
            wait_until(lambda: time.time() > t_dashboard + 2.5, "two alert evaluations of the new app", 30)
            rig.agent.start()
            wait_until(lambda: rig.ticks(HOST_TICK)[-1] / 1000 > t_on, "a tick of the new agent", 120, interval=0.1)
            t_sample = time.time()
            wait_until(lambda: rig.ticks(VLLM_TICK)[-1] / 1000 > t_on, "a scrape of the new server", 120, interval=0.1)
            t_vllm = time.time()
            (rig.tmp / "reboot-cost.json").write_text(
                json.dumps(
                    {
                        "dashboard_s": t_dashboard - t_on,  # the app's start; the agent's unit is started after it
                        "first_sample_s": t_sample - t_on,
                        "first_vllm_sample_s": t_vllm - t_on,
                    }
                )
            )
            print(f"reboot cost: {json.loads((rig.tmp / 'reboot-cost.json').read_text())}")
            # the cold cache refills while the short hit-rate window slides past the reboot
            rig.wait_stored(30, "30 ticks of traffic after the reboot")
            opened = _alerts(rig)
            assert opened == [], [(a["rule"], a["state"], a.get("message")) for a in opened]

            first_new = next(t for t in rig.ticks(HOST_TICK) if t / 1000 > t_on) / 1000
            rig.check_once_and_complete(max_hole_s=4.0, holes_allowed=[(t_off - 1.0, first_new)])
            vllm = rig.ticks(VLLM_TICK)
            assert len(vllm) == len(set(vllm))
            # the new server's counters start over: recorded as a reset (no negative rate), not a drop
            assert [e for e in rig.events() if e[1] in ("restart", "counter_reset") and e[0] > t_on - 1]

            # the same rules are live: the agent silent while the app runs is an alert
            rig.agent.kill9()
            wait_until(
                lambda: any(a["rule"] == "agent_stale" and a["state"] == "firing" for a in _alerts(rig)),
                "agent_stale firing on a real silence",
                60,
            )
        finally:
            stop.set()
            traffic.join(15)
