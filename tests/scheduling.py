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

A scheduler rather than `--dist loadgroup` with `xdist_group` marks: pytest-xdist 3.8 on pytest
9.2 silently stops grouping by mark (it rewrites a node id field pytest no longer reads;
pytest-dev/pytest-xdist#1386), so tests meant to share a server would run on different workers.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# node id prefix -> work unit; the first matching prefix wins
GROUPS = (
    ("tests/realvllm/test_controller_real.py::", "realvllm-controller"),
    ("tests/realvllm/", "realvllm"),
)


def group_of(nodeid: str) -> str:
    """The work unit of a test: its group, or the test itself."""
    for prefix, group in GROUPS:
        if nodeid.startswith(prefix):
            return group
    return nodeid


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with the scopes of `group_of`."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)
