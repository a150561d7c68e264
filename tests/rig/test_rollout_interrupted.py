"""A rollout in flight when the agent or the app is killed (-9) ends in a known state once the
killed process is started again: healthy, rolled_back or failed, with a reason; never left
`waiting_health` until the app's hour-long silence expiry gives up on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.rig.units import Rig, rig_units
from tests.waits import wait_until

pytestmark = pytest.mark.slow
TERMINAL = {"healthy", "rolled_back", "failed", "refused"}
PROFILE = {"name": "seqs32", "spec": {"extra_args": ["--max-num-seqs", "32"]}}


def _start_rollout(rig: Rig) -> int:
    wait_until(rig.sim_healthy, "the supervised sim healthy", 90)
    inst = wait_until(lambda: (i := rig.instance()) and i.get("cache_config") and i, "the instance's config", 60)
    assert rig.post("/api/v1/profiles", PROFILE).status_code == 201
    r = rig.post("/api/v1/rollouts", {"instance": inst["id"], "profile": PROFILE["name"]})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _rollout(rig: Rig, rid: int) -> dict[str, Any]:
    return dict(rig.api(f"/api/v1/rollouts/{rid}"))


def _server_argv(rig: Rig) -> list[str]:
    [pid_file] = list((rig.ctl_dir / "logs").glob("*.pid.json"))
    return [str(a) for a in json.loads(pid_file.read_text())["extra_argv"]]


def test_an_agent_killed_while_vllm_restarts_ends_the_rollout_after_its_own_restart(tmp_path: Path) -> None:
    # every start of the sim takes 4 s before its port opens: the rollout sits in waiting_health
    with rig_units(tmp_path, sim_startup_delay=4) as rig:
        rid = _start_rollout(rig)
        wait_until(lambda: _rollout(rig, rid)["state"] == "waiting_health", "the rollout waiting for health", 90)
        rig.agent.kill9()
        rig.agent.start()
        got = wait_until(
            lambda: (r := _rollout(rig, rid))["state"] in TERMINAL and r, "the rollout ending after the restart", 120
        )
        assert got["state"] in ("rolled_back", "failed", "healthy"), got
        assert "agent" in got["message"] and "restart" in got["message"], got["message"]
        wait_until(rig.sim_healthy, "a healthy server after it", 60)
        assert len(rig.sim_processes()) == 1
        if got["state"] == "rolled_back":
            assert _server_argv(rig) == []  # back on the initial args
        # a later rollout is not blocked by the interrupted one
        inst = rig.instance()
        assert inst is not None
        r = rig.post("/api/v1/rollouts", {"instance": inst["id"], "profile": PROFILE["name"]})
        assert r.status_code == 201, r.text


def test_an_app_killed_mid_rollout_learns_how_it_ended_from_the_spool(tmp_path: Path) -> None:
    with rig_units(tmp_path, sim_startup_delay=3) as rig:
        rid = _start_rollout(rig)
        wait_until(lambda: _rollout(rig, rid)["state"] == "waiting_health", "the rollout waiting for health", 90)
        rig.app.kill9()
        # the agent goes on alone: the new server healthy on the profile's flags, the app still down
        wait_until(lambda: rig.sim_healthy() and _server_argv(rig) == ["--max-num-seqs", "32"], "the switch", 90)
        rig.app.start()
        wait_until(rig.app_answers, "the app back", 120, interval=0.2)
        got = wait_until(lambda: (r := _rollout(rig, rid))["state"] in TERMINAL and r, "the rollout's end", 120)
        assert got["state"] == "healthy", got
        inst = rig.instance()
        assert inst is not None
        prof = rig.api(f"/api/v1/instances/{inst['id']}/profile")
        assert prof["current"]["name"] == PROFILE["name"], prof
