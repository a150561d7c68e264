"""How pytest-xdist shares the suite out between workers (`-n N`, what scripts/test passes).

Every test is its own work unit, except the real-vLLM tests, in two units: the controller module
(one app + agent + launcher stack that restarts vLLM eleven times: the suite's longest chain) and
the other real-vLLM modules (one vLLM at a time from their worker's pool, servers shared between
modules with the same flags). A unit runs on one worker, so at most two vLLMs run at once (2
cores); being the biggest units, they are handed out first (xdist's default scope reordering), and
the workers go on with the rest of the suite when their unit is done.

A scheduler rather than `--dist loadgroup` with `xdist_group` marks: pytest-xdist 3.8 on pytest
9.2 silently stops grouping by mark (it rewrites a node id field pytest no longer reads;
pytest-dev/pytest-xdist#1386), so the real-vLLM tests would start two servers at once.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# node id prefix -> work unit (the first prefix that matches)
GROUPS = {
    "tests/realvllm/test_controller_real.py": "realvllm-stack",
    "tests/realvllm/": "realvllm",
}


def group_of(nodeid: str) -> str:
    """The work unit of a test: its group, or the test itself."""
    for prefix, group in GROUPS.items():
        if nodeid.startswith(prefix):
            return group
    return nodeid


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with the scopes of `group_of`."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)
