"""Fixtures for tests against a real `vllm serve` (CPU build, tiny local model).

Every test here carries the `realvllm` marker. When tests/realvllm/setup.sh did not (or could
not) set the install up, they SKIP with the reason, so the summary line counts them.

At most one vLLM runs at a time (2 cores; under pytest-xdist these tests all run on one worker):
`vllm_pool.get(flags)` reuses the running server when the flags match and otherwise stops it
before starting the next one; the server is stopped at the end of every test module, and at the
end of the session whatever happens.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from .server import Install, Server, default_install

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark these tests. (Under pytest-xdist they run on one worker, first: tests/scheduling.py.)"""
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.realvllm)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def realvllm_install() -> Install:
    if os.environ.get("KVSCOPE_REALVLLM", "1") == "0":
        pytest.skip("KVSCOPE_REALVLLM=0: real vLLM tests switched off on purpose")
    install = default_install()
    problem = install.problem()
    if problem:
        pytest.skip(f"no real vLLM here: {problem}")
    return install


class ServerPool:
    """Holds at most one running `vllm serve`."""

    def __init__(self, install: Install, root: Path) -> None:
        self.install = install
        self.root = root
        self.current: Server | None = None
        self.started = 0
        self.start_times: list[tuple[tuple[str, ...], float]] = []
        self.stop_notes: list[str] = []

    def get(self, flags: Sequence[str] = (), env_extra: dict[str, str] | None = None) -> Server:
        key = tuple(flags)
        cur = self.current
        if (
            cur is not None
            and cur.flags == key
            and cur.env_extra == dict(env_extra or {})
            and cur.proc is not None
            and cur.proc.poll() is None
        ):
            return cur
        self.release()
        self.started += 1
        server = Server(self.install, self.root / f"server{self.started}", key, env_extra=dict(env_extra or {}))
        self.current = server
        server.start()
        took = server.wait_healthy()
        self.start_times.append((key, took))
        return server

    def release(self) -> None:
        if self.current is not None:
            self.stop_notes += self.current.stop()
            self.current = None


@pytest.fixture(scope="session")
def realvllm_jobs() -> Iterator[Path]:
    """A job folder of our own (not pytest's basetemp: concurrent pytest sessions on this machine
    prune each other's basetemps). Removed at the end unless KVSCOPE_REALVLLM_KEEP=1."""
    root = Path(tempfile.mkdtemp(prefix="kvscope-realvllm-"))
    try:
        yield root
    finally:
        if os.environ.get("KVSCOPE_REALVLLM_KEEP") == "1":
            print(f"\nrealvllm: job folder kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def vllm_pool(realvllm_install: Install, realvllm_jobs: Path) -> Iterator[ServerPool]:
    pool = ServerPool(realvllm_install, realvllm_jobs / "pool")
    try:
        yield pool
    finally:
        pool.release()
        for flags, took in pool.start_times:
            print(f"\nrealvllm: vllm serve {' '.join(flags) or '(base flags)'} healthy after {took:.1f} s")


@pytest.fixture(scope="module", autouse=True)
def _one_server_per_module(vllm_pool: ServerPool) -> Iterator[None]:
    """Stop the module's server when the module ends (the next module may need other flags,
    and the rest of the suite needs the CPU back)."""
    yield
    vllm_pool.release()
