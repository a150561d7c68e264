"""How pytest-xdist shares the suite out between workers (`-n N`, what scripts/test passes).

Every test is its own work unit, except tests/realvllm: one unit, so its tests run on one worker
(one `vllm serve` at a time on 2 cores, its pool and stacks are per worker) and, being the biggest
unit, it is handed out first (xdist's default scope reordering): the longest chain of the suite
starts at once and the other worker(s) run everything else beside it.

A scheduler rather than `--dist loadgroup` with `xdist_group` marks: pytest-xdist 3.8 on pytest
9.2 silently stops grouping by mark (it rewrites a node id field pytest no longer reads;
pytest-dev/pytest-xdist#1386), so the real-vLLM tests would start two servers at once.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# node id prefix -> work unit
GROUPS = {"tests/realvllm/": "realvllm"}


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
