"""Fixtures for tests against a real `vllm serve` (CPU build, tiny local model).

Every test here carries the `realvllm` marker. When tests/realvllm/setup.sh did not (or could
not) set the install up, they SKIP with the reason, so the summary line counts them.

At most one vLLM runs at a time per pytest process: `vllm_pool.get(flags)` reuses the running
server when the flags match and otherwise stops it before starting the next one (modules with the
same flags share one start); the server is stopped after the last real-vLLM test, and at the end
of the session whatever happens. Under pytest-xdist (tests/scheduling.py) the controller stack's
module is one work unit and every other module here another, each on one worker: two vLLMs at
most, side by side.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.realvllm.server import IN_PROCESS_ENGINE, Install, Server, default_install
from tests.realvllm.workload import POOL_BLOCKS
from tests.tiers import unavailable

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
        unavailable("realvllm", "KVSCOPE_REALVLLM=0: real vLLM tests switched off on purpose")
    install = default_install()
    problem = install.problem()
    if problem:
        unavailable("realvllm", f"no real vLLM here: {problem}")
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


POOLS: list[ServerPool] = []  # the session's pool, for pytest_runtest_teardown


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
def _needs_the_install(vllm_pool: ServerPool) -> None:
    """Every test here skips, with the reason, where the real vLLM is not set up."""
    POOLS[:] = [vllm_pool]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of a run of real-vLLM tests, stop the pool's server: the rest of the
    suite needs the CPU back. Between modules it keeps running, so the next module reuses it when
    its flags are the same (connector_server); `vllm_pool.get` stops it when they are not."""
    if nextitem is None or not Path(str(nextitem.fspath)).resolve().is_relative_to(HERE):
        for pool in POOLS:
            pool.release()


@pytest.fixture(scope="session")
def connector_store(realvllm_jobs: Path) -> Path:
    """Where vLLM's ExampleConnector keeps the KV blocks of connector_server (a disk tier)."""
    path = realvllm_jobs / "example-connector-store"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def kv_events_endpoint() -> str:
    return f"tcp://*:{free_port()}"


@pytest.fixture(scope="module")
def connector_server(vllm_pool: ServerPool, connector_store: Path, kv_events_endpoint: str) -> Server:
    """A 24-block GPU pool, vLLM's ExampleConnector as an unbounded disk tier, and KV events on a
    socket it binds (found through GET /kv_event_sources). One server for the external-tier and
    the sizing modules (one start instead of two); their prompts share no prefix."""
    connector = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(connector_store)},
    }
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_events_endpoint, "topic": "kv-events"}
    return vllm_pool.get(
        (
            "--enforce-eager",
            "--num-gpu-blocks-override",
            str(POOL_BLOCKS),
            "--kv-transfer-config",
            json.dumps(connector),
            "--kv-events-config",
            json.dumps(events),
        ),
        env_extra=IN_PROCESS_ENGINE,
    )
