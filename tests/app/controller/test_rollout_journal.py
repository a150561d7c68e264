"""A controller restarted in the middle of a rollout (its agent killed) ends that rollout from its
journal (agent/rollout_journal.py): rolled back when the server was being switched, run again when
nothing had been restarted yet, re-told when it had finished. Fake launcher, no processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.controller import Controller, ManagedInstance
from agent.launcher.health import HealthResult
from agent.preflight import GIB
from agent.rollout_journal import RolloutJournal
from tests.app.controller.test_controller import BOX, FIX, HELP, URL, FakeLauncher, _cmd, _probe, _server
from tests.waits import wait_until

LKG = ["--max-model-len", "4096"]
NEW = ["--kv-cache-dtype", "fp8"]


class AgentKilled(BaseException):
    """Stands for the agent process dying at this point (nothing after it runs)."""


class DiesWhileWaiting(FakeLauncher):
    def wait_healthy(self, url: str, deadline_s: float, **_: Any) -> HealthResult:
        raise AgentKilled


def _controller(launcher: FakeLauncher, journal: Path) -> Controller:
    inst = ManagedInstance(
        url=URL,
        launcher=launcher,
        initial_args=list(LKG),
        proc_root=BOX / "proc",
        cgroup_root=BOX / "sys" / "fs" / "cgroup",
        model_dirs=[FIX / "models"],
    )
    return Controller(
        [inst],
        probe_fn=_probe(),
        http=_server(),
        help_reader=lambda _c, _e: HELP,
        shm_free=lambda _p: 16 * GIB,
        journal=RolloutJournal(journal),
    )


def _killed_in_waiting_health(journal: Path) -> FakeLauncher:
    """A first agent: accepts rollout 7, restarts the server on NEW, dies waiting for its health."""
    first = DiesWhileWaiting()
    ctl = _controller(first, journal)
    ctl.submit(_cmd(7, NEW), 0.0)
    try:
        ctl.run_rollout(_cmd(7, NEW))
    except AgentKilled:
        pass
    assert [u.state for u in ctl.drain_updates()][-1] == "waiting_health"
    survivor = FakeLauncher()  # what the next agent adopts: the server on the new flags
    survivor._argv = list(NEW)
    return survivor


def test_a_rollout_the_agent_died_in_is_rolled_back_by_the_next_agent(tmp_path: Path) -> None:
    journal = tmp_path / "ctl" / "rollouts-in-flight.json"
    adopted = _killed_in_waiting_health(journal)
    ctl = _controller(adopted, journal)
    ctl.recover()
    ctl.run_interrupted()
    ups = ctl.drain_updates()
    assert [u.state for u in ups] == ["rolling_back", "rolled_back"]
    assert all(u.rollout_id == 7 for u in ups)
    assert "agent was restarted" in ups[-1].message and "waiting_health" in ups[-1].message
    assert adopted.calls == [("stop", []), ("start", LKG)]
    # the app may hand rollout 7 again (its last state never reached it): not run twice
    ctl.submit(_cmd(7, NEW), 1.0)
    assert ctl.drain_updates() == []
    # once finished and told, the next rollout clears it from the journal
    ctl.submit(_cmd(8, NEW), 2.0)
    assert [e.id for e in RolloutJournal(journal).entries()] == [8]


def test_a_server_already_back_on_last_known_good_is_checked_not_restarted(tmp_path: Path) -> None:
    journal = tmp_path / "rollouts.json"
    _killed_in_waiting_health(journal)
    on_lkg = FakeLauncher()
    on_lkg._argv = list(LKG)  # the next agent found it dead and started it on last-known-good
    ctl = _controller(on_lkg, journal)
    ctl.recover()
    ctl.run_interrupted()
    assert [u.state for u in ctl.drain_updates()] == ["rolling_back", "rolled_back"]
    assert on_lkg.calls == []


def test_a_rollout_accepted_but_not_started_is_run_again(tmp_path: Path) -> None:
    journal = tmp_path / "rollouts.json"
    first = _controller(FakeLauncher(), journal)
    first.submit(_cmd(9, NEW), 0.0)  # accepted, queued; the agent dies before its worker takes it
    server = FakeLauncher()
    ctl = _controller(server, journal)
    ctl.recover()
    ctl.start_worker()
    try:
        got: list[str] = []
        wait_until(lambda: got.extend(u.state for u in ctl.drain_updates()) or "healthy" in got, "rollout 9", 30)
    finally:
        ctl.stop_on_exit = False
        ctl.close()
    assert got[0] == "preflight" and got[-1] == "healthy"
    assert server.calls == [("stop", []), ("start", NEW)]


def test_a_finished_rollout_is_told_again_once_then_forgotten(tmp_path: Path) -> None:
    journal = tmp_path / "rollouts.json"
    first = _controller(FakeLauncher(), journal)
    first.submit(_cmd(10, NEW), 0.0)
    assert first.run_rollout(_cmd(10, NEW)) == "healthy"  # its last update may have died with the agent
    ctl = _controller(FakeLauncher(), journal)
    ctl.recover()
    assert [(u.rollout_id, u.state) for u in ctl.drain_updates()] == [(10, "healthy")]
    assert RolloutJournal(journal).entries() == []


def test_a_garbled_journal_is_an_empty_one(tmp_path: Path) -> None:
    journal = tmp_path / "rollouts.json"
    for text in ("{not json", json.dumps({"rollouts": [{"id": "x"}, 3, None]}), json.dumps([1, 2])):
        journal.write_text(text)
        ctl = _controller(FakeLauncher(), journal)
        ctl.recover()
        ctl.run_interrupted()
        assert ctl.drain_updates() == []
