"""kill -9 of the agent: started again (its unit's command), it adopts the server it had started
(the launcher's pid file), starts no second one, and no batch is lost or stored twice around the
restart (the spool, the agent id and the sequence numbers live in its state folder)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.rig.units import HOST_TICK, VLLM_TICK, rig_units
from tests.waits import wait_until

pytestmark = pytest.mark.slow


def test_a_killed_agent_comes_back_adopts_its_server_and_loses_no_batch(tmp_path: Path) -> None:
    with rig_units(tmp_path) as rig, rig.watching_spool():
        wait_until(rig.sim_healthy, "the supervised sim healthy", 60)
        rig.wait_stored(3, "three ticks stored")
        server = rig.sim_pid()
        assert server is not None and rig.sim_processes() == [server]
        agent_id = rig.agent_id()
        t_kill = time.time()
        rig.agent.kill9()
        assert rig.sim_processes() == [server], "kill -9 of the agent took its server down"
        rig.agent.start()
        wait_until(lambda: rig.ticks(HOST_TICK)[-1] / 1000 > t_kill + 1, "a tick of the new agent stored", 90)
        rig.wait_stored(3, "three ticks of the new agent")
        t_back = rig.ticks(HOST_TICK)[-4] / 1000  # the new agent's first stored tick or before

        assert rig.agent_id() == agent_id
        assert rig.sim_pid() == server and rig.sim_processes() == [server], "a second server, or a new one"
        notes = [m for _t, _k, m in rig.events("note") if "adopted" in m]
        assert notes, "the new agent did not say it adopted the server"
        # the server's counters go on: no restart or reset is recorded for it
        assert not [e for e in rig.events() if e[1] in ("restart", "counter_reset") and e[0] > t_kill]
        rig.check_once_and_complete(max_hole_s=4.0, holes_allowed=[(t_kill - 1.0, t_back)])
        vllm = rig.ticks(VLLM_TICK)
        assert len(vllm) == len(set(vllm))
