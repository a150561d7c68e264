"""How pytest-xdist shares the suite out between workers (`-n N`, what scripts/test passes).

Every test is its own work unit, except the real-vLLM tests, which form two units:
- `realvllm-controller`: tests/realvllm/test_controller_real.py, one stack (app, agent, the
  agent's vLLM) whose tests build on each other (rollouts, then an A/B, then the dashboard);
- `realvllm`: every other module of tests/realvllm, one `vllm serve` at a time from the worker's
  server pool (modules with the same flags share one start).
A unit runs on one worker, its tests in order. Being the biggest units, the two are handed out
first (xdist's scope reordering), one to each worker: the two longest chains of the suite start at
once, side by side (two vLLMs at a time at most), and everything else fills in around them. On
one worker (`-n 1`) they simply run one after the other.

After them come the files whose tests run real processes for tens of seconds each (`SLOW_FILES`,
longest first), then everything else in collection order: longest-processing-time first, so the
suite does not end with one worker on an 80 s test while the other has nothing left to do. In
collection order those files come last (tests/rig, tests/up, tests/sizing sort late). Files are
named by their name alone (with their last folder where two files share a name), so the list
still holds when tests move between folders; tests/test_scheduling.py checks that each one is
there.

A scheduler rather than `--dist loadgroup` with `xdist_group` marks: pytest-xdist 3.8 on pytest
9.2 silently stops grouping by mark (it rewrites a node id field pytest no longer reads;
pytest-dev/pytest-xdist#1386), so tests meant to share a server would run on different workers.
"""

from __future__ import annotations

from collections import OrderedDict

from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

# node id prefix -> work unit; the first matching prefix wins
GROUPS = (
    ("tests/realvllm/test_controller_real.py::", "realvllm-controller"),
    ("tests/realvllm/", "realvllm"),
)
# Test files whose tests each take tens of seconds on a 2-core CI machine (pytest --durations of
# `.ci/run`), longest first; a test of a file not named here counts as short.
SLOW_FILES = (
    "test_reboot.py",
    "test_up_readme_rig.py",
    "test_up_follows_kv_events.py",
    "test_mooncake_trace.py",
    "ab/test_calibration.py",
    "test_reuse_distances.py",
    "test_app_killed.py",
    "test_vllm_killed.py",
    "ab/test_e2e_sim.py",
    "test_rollout_interrupted.py",
    "test_chunks.py",
    "test_live_values.py",
    "test_many_hosts.py",
    "test_agent_killed.py",
    "test_dashboard_sim_agent.py",
    "test_chunk_conversion.py",
    "test_sizing_page.py",
    "test_up_supervision.py",
)
_GROUP_NAMES = {group for _, group in GROUPS}


def group_of(nodeid: str) -> str:
    """The work unit of a test: its group, or the test itself."""
    for prefix, group in GROUPS:
        if nodeid.startswith(prefix):
            return group
    return nodeid


def rank(scope: str) -> int:
    """Where a work unit goes in the queue: the real-vLLM units (0), the slow files' tests in
    `SLOW_FILES` order (1, 2, ...), then everything else (len(SLOW_FILES) + 1)."""
    if scope in _GROUP_NAMES:
        return 0
    path = "/" + scope.split("::", 1)[0]
    for i, tail in enumerate(SLOW_FILES):
        if path.endswith("/" + tail):
            return i + 1
    return len(SLOW_FILES) + 1


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with the scopes of `group_of`, handed out in `rank` order."""

    _ranked = False

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)

    def _assign_work_unit(self, node: WorkerController) -> None:
        if not self._ranked:  # the queue is complete by the first assignment (schedule())
            # a stable sort: within a rank, xdist's order (biggest unit first, then collection order)
            ordered = sorted(self.workqueue.items(), key=lambda item: rank(item[0]))
            self.workqueue = OrderedDict(ordered)
            self._ranked = True
        super()._assign_work_unit(node)
