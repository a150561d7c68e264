"""kill -9 of vLLM (the simulator under the agent's subprocess launcher): the agent reports it and
restarts it (its restart policy), and the store shows the gap as it was: no reading stands for
the seconds the server was gone, the new process is a restart, not a drop of the counters."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.rig.units import VLLM_TICK, rig_units
from tests.waits import wait_until

pytestmark = pytest.mark.slow


def test_a_killed_vllm_is_reported_restarted_and_its_gap_left_empty(tmp_path: Path) -> None:
    with rig_units(tmp_path) as rig:
        wait_until(rig.sim_healthy, "the supervised sim healthy", 60)
        for i in range(10):
            rig.request(f"before the kill, request {i}: " + "word " * 50)
        rig.wait_stored(3, "three ticks stored")
        server = rig.sim_pid()
        assert server is not None
        t_kill = time.time()
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: rig.sim_pid() not in (None, server), "the agent restarting the server", 60)
        wait_until(rig.sim_healthy, "the restarted sim healthy", 60)
        t_up = time.time()
        wait_until(lambda: rig.ticks(VLLM_TICK)[-1] / 1000 > t_up + 1, "scrapes of the new server stored", 60)
        for i in range(10):
            rig.request(f"after the restart, request {i}: " + "word " * 50)
        rig.wait_stored(3, "three more ticks")

        assert len(rig.sim_processes()) == 1
        said = [m for t, _k, m in rig.events() if t >= t_kill - 1 and "SIGKILL" in m]
        assert said, "the agent did not report how the server died"
        # the restart is recorded as one (process start time moved), so rates never go negative
        assert [e for e in rig.events("restart") if e[0] >= t_kill - 1], "no restart event for the new server"
        inst = rig.instance()
        assert inst is not None
        ticks = [t / 1000 for t in rig.ticks(VLLM_TICK)]
        before = [t for t in ticks if t < t_kill]
        after = [t for t in ticks if t >= t_kill]
        # nothing stored for the dead server: the first reading after the kill is the new server's
        assert before and after and after[0] >= t_kill
        assert rig.ticks("vllm:prompt_tokens_total")  # through the store's reader: head and chunks
        # the instance page's token chart across the restart: rates, none negative
        chart = rig.api(f"/api/v1/instances/{inst['id']}/charts/tokens?range=5m")
        assert chart["figure"] is not None, chart.get("notes")
        values = [v for tr in chart["figure"]["data"] for v in (tr.get("y") or []) if isinstance(v, int | float)]
        assert values and all(v >= 0 for v in values), "a negative rate across the restart"
        assert any(v > 0 for v in values), "the traffic before and after the kill is not on the chart"
