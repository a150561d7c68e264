"""kill -9 of the app while the agent pushes: the agent spools, the app is started again the way
its unit starts it, and the spool drains: every batch the agent produced is stored exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rig.units import rig_units
from tests.waits import wait_until

pytestmark = pytest.mark.slow


def test_the_app_killed_mid_push_comes_back_and_every_spooled_batch_is_stored_once(tmp_path: Path) -> None:
    with rig_units(tmp_path) as rig, rig.watching_spool():
        rig.wait_stored(3, "three ticks stored before the crash")
        rig.app.kill9()
        # down long enough for batches to wait in the spool (a precondition, not a timing assertion)
        wait_until(lambda: len(rig.spool_now()) >= 4, "4 batches waiting in the spool", 60)
        waiting = rig.spool_now()
        rig.app.start()  # Restart=on-failure: the unit's own command again
        wait_until(rig.app_answers, "the app back", 120, interval=0.2)
        wait_until(lambda: waiting <= rig.stored_seqs(), "the batches spooled during the outage stored", 120)
        rig.wait_stored(2, "two ticks after the drain")
        rig.check_once_and_complete(max_hole_s=4.0)
        assert rig.instance() is not None
