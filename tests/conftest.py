"""Shared fixtures: a migrated SQLite file, the real app in-process, batch builders."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tiers import unavailable

REPO = Path(__file__).resolve().parent.parent
SHARED_FIXTURES = REPO / "tests" / "fixtures"
# Host headers the in-process test clients send (TestClient: "testserver"), for every app a test
# builds (the default allow-list is tested in tests/security).
TEST_HOSTS = ["testserver", "localhost", "127.0.0.1", "::1"]
os.environ.setdefault("KVSCOPE_ALLOWED_HOSTS", json.dumps(TEST_HOSTS))
# Each pytest process (each xdist worker) its own folder of simulated-GPU state files: the fake
# nvidia-smi sums every live sim's file in the folder, so sims of tests running side by side on
# other workers would otherwise show up in this worker's GPU readings.
os.environ.setdefault("KVSCOPE_SIM_STATE_DIR", tempfile.mkdtemp(prefix="kvscope-sim-state-"))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `-n N` (xdist's default `load` distribution): tests/realvllm on one worker, first
    (tests/scheduling.py). An explicit `--dist` other than load is left to xdist."""
    if config.getvalue("dist") != "load":
        return None
    from tests.scheduling import GroupScheduling

    return GroupScheduling(config, log)


class FakeClock:
    """Time as an argument: tests move it by hand, nothing sleeps."""

    def __init__(self, t: float | None = None) -> None:
        self.t = time.time() if t is None else t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000.0)


# --- databases (scale-out team): storage/API tests run on SQLite and on a real PostgreSQL.
# Tests under BOTH_DB_DIRS (or marked `both_databases`, or every test when
# KVSCOPE_TEST_DATABASES=all) get `db_backend` parametrised over sqlite and postgres; all other
# tests stay on SQLite. The postgres variants SKIP with a reason when the server binaries are
# missing. The cluster is started once per session by tests/pg.py.
BOTH_DB_DIRS = (
    "tests/app/ingest/test_ingest",
    "tests/app/storage",
    "tests/app/derived/test_derived_truth",
    "tests/app/controller/test_rollouts_store",
    "tests/app/alerts/test_cas",
    "tests/scale",
    "tests/security/test_ingest_limits",
)


def _wants_both(metafunc: Any) -> bool:
    if os.environ.get("KVSCOPE_TEST_DATABASES", "") == "all":
        return True
    if metafunc.definition.get_closest_marker("both_databases"):
        return True
    rel = Path(str(metafunc.definition.path)).resolve().relative_to(REPO).as_posix()
    return rel.startswith(BOTH_DB_DIRS)


def pytest_generate_tests(metafunc: Any) -> None:
    if "db_backend" in metafunc.fixturenames and _wants_both(metafunc):
        metafunc.parametrize("db_backend", ["sqlite", "postgres"], indirect=True)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """A PostgreSQL server for the whole session (tests/pg.py), or a skip saying why not."""
    from tests.pg import start_cluster

    try:
        cluster = start_cluster()
    except LookupError as exc:
        unavailable("postgres", f"PostgreSQL unavailable: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def db_backend(request: Any) -> str:
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture(scope="session")
def fed_databases(tmp_path_factory: Any) -> Any:
    """The session's fed databases (tests/fed_databases.py): each built once, copied per test."""
    from tests.fed_databases import FedDatabases

    return FedDatabases(tmp_path_factory.mktemp("fed-databases"))


def _fed(request: Any) -> Any:
    """The Feed of the test's `fed_database` marker, or None."""
    mark = request.node.get_closest_marker("fed_database")
    return mark.args[0] if mark else None


@pytest.fixture
def db_url(db_backend: str, tmp_path: Path, request: Any) -> Iterator[str]:
    """The URL of a fresh, migrated database of the backend under test (a copy of one migrated
    once per session); with @pytest.mark.fed_database(FEED), a copy of that feed's database."""
    feed = _fed(request)
    if db_backend == "sqlite":
        path = tmp_path / "data" / "kvscope.db"
        made = request.getfixturevalue("fed_databases")
        if feed is not None:
            made.copy_sqlite(feed, path)
        else:
            made.copy_migrated_sqlite(path)  # migrated once per session
        yield f"sqlite:///{path}"
        return
    cluster = request.getfixturevalue("pg_cluster")
    name = request.getfixturevalue("fed_databases").new_postgres(cluster, feed) if feed else cluster.new_database()
    try:
        yield cluster.url(name)
    finally:
        cluster.drop_database(name)


@pytest.fixture
def settings(tmp_path: Path, db_backend: str, request: Any) -> Any:
    from app.settings import load_settings

    url = request.getfixturevalue("db_url")
    if db_backend == "sqlite":
        url = None  # the SQLite file db_url put in data_dir, found there as by a user's install
    return load_settings(
        None, data_dir=str(tmp_path / "data"), run_scheduler=False, database_url=url, allowed_hosts=TEST_HOSTS
    )


@pytest.fixture
def engine(settings: Any) -> Iterator[Any]:
    from app.storage.engine import open_database

    eng = open_database(settings.effective_database_url)
    yield eng
    eng.dispose()


@pytest.fixture
def app(settings: Any, engine: Any, clock: FakeClock) -> Any:
    from app.main import create_app

    return create_app(settings, engine=engine, clock=clock, start_jobs=False)


@pytest.fixture
def token(engine: Any, clock: FakeClock) -> str:
    """An agent token bound to host rig1 (make_batch's default host)."""
    from app.storage.tokens import create_token

    return create_token(engine, "test-agent", clock(), host="rig1")


def api_token(engine: Any, role: str = "admin", name: str | None = None) -> str:
    """An API token of `role` for a test's requests (Authorization: Bearer)."""
    from app.storage.tokens import create_token

    return create_token(engine, name or f"test-{role}-{os.urandom(4).hex()}", time.time(), role=role)


@pytest.fixture
def client(app: Any) -> Iterator[Any]:
    """A synchronous client driving the real ASGI app in-process, as an admin (API token); a test
    that sends its own Authorization header (an agent token) replaces it."""
    from fastapi.testclient import TestClient

    with TestClient(app) as c:
        c.headers["Authorization"] = "Bearer " + api_token(app.state.ctx.engine)
        yield c


def make_batch(
    seq: int,
    ts: float,
    *,
    agent_id: str = "agent-1",
    host: str = "rig1",
    instance: str = "http://127.0.0.1:8000",
    samples: list[tuple[str, dict[str, str], float]] | None = None,
    types: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A wire batch (plain dict) with one scrape."""
    samples = (
        samples
        if samples is not None
        else [("vllm:prompt_tokens_total", {"model_name": "m", "engine": "0"}, 100.0 * seq)]
    )
    return {
        "agent_id": agent_id,
        "host": host,
        "seq": seq,
        "sent_at": ts,
        "scrapes": [
            {
                "instance": instance,
                "ts": ts,
                "ok": True,
                "healthy": True,
                "model": "m",
                "version": "0.32.0",
                "types": types or {"vllm:prompt_tokens": "counter"},
                "samples": [{"name": n, "labels": lab, "value": v} for n, lab, v in samples],
            }
        ],
    }


@pytest.fixture
def batch_factory() -> Any:
    return make_batch


# Tiers: `-m "not slow"` is the everyday tier (minutes); the whole suite (what CI runs) adds the
# slow tests. A test that starts an outside program the everyday tier does without (a real vLLM,
# Chromium, network namespaces, a Prometheus server) is slow by that marker alone.
SLOW_MARKERS = ("realvllm", "browser", "netns", "prometheus")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        if not item.get_closest_marker("slow") and any(item.get_closest_marker(m) for m in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)


def pytest_report_header(config: Any) -> str:
    return f"kvscope tests; CI={os.environ.get('CI', '')}"
