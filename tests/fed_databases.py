"""Databases built once per test session and copied for each test: the migrated empty SQLite
file every test starts from, and fed databases for the tests that ask for one.

The slowest tests used to push hundreds of recorded batches through the ingest API one at a time,
per test and per backend. A `Feed` names what goes into a database and how (POSTed through the
real ingest API with the app's clock following the batches, or written by the real IngestWriter);
the first test that asks for a feed pays for it once, later ones get a copy:

- SQLite: the fed file is checkpointed (WAL folded in) and copied with shutil.copy;
- PostgreSQL: the rows of that same fed SQLite file are copied (bulk, through the app's own table
  definitions) into a migrated PostgreSQL database once; that database is then the template each
  test's database is made from (`CREATE DATABASE t TEMPLATE fed`). So a feed goes through the
  ingest API once per session, not once per test and backend; ingest itself on PostgreSQL is tested
  batch by batch in tests/app/ingest/test_ingest.py and tests/app/api.

Under pytest-xdist the SQLite files (fed and migrated-empty) are built once for all workers: in
the session's common temp folder, under a file lock per database, the first worker to ask builds
it and the others wait for it and copy it (each worker still has its own PostgreSQL cluster, so
its PostgreSQL template is made from that shared file).

A test asks with `@pytest.mark.fed_database(FEED)`: tests/conftest.py's `db_url` then yields a
copy of the fed database instead of an empty migrated one, and the usual `settings`, `engine`,
`app`, `client`, `token` fixtures run on it. The copy is the database the test would have built
itself, so its assertions are unchanged (an app opened on it is an app restarted on that data).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Batches = list[dict[str, Any]]


@dataclass(frozen=True)
class Feed:
    """What a fed database holds: `name` is the cache key (one fed database per name and backend),
    `batches` builds the wire batches, `via` is how they go in: "api" (POST /api/v1/ingest, one at
    a time, the app's FakeClock following each batch) or "writer" (parse_batch + IngestWriter)."""

    name: str
    batches: Callable[[], Batches] = field(compare=False)
    via: str = "api"

    def __post_init__(self) -> None:
        if self.via not in ("api", "writer"):
            raise ValueError(f"Feed {self.name}: via must be 'api' or 'writer', not {self.via!r}")


def feed_database(feed: Feed, data_dir: Path, database_url: str | None) -> None:
    """Put `feed`'s batches into the (migrated on open) database at database_url, or at the SQLite
    file of data_dir when None, the way the feed says."""
    from app.storage.engine import open_database

    batches = feed.batches()
    if feed.via == "api":
        from tests.app.dashboard.recorded import fed_app

        with fed_app(data_dir, batches, batches[0]["sent_at"], database_url=database_url):
            return
    from app.ingest.parse import parse_batch
    from app.settings import load_settings
    from app.storage.ingest_store import IngestWriter

    settings = load_settings(None, data_dir=str(data_dir), run_scheduler=False, database_url=database_url)
    engine = open_database(settings.effective_database_url)
    try:
        writer = IngestWriter(engine)
        for b in batches:
            raw = json.dumps(b).encode()
            writer.write(parse_batch(raw, b["sent_at"], max_future_skew_s=300, max_past_age_s=1e9), b["sent_at"])
    finally:
        engine.dispose()


class FedDatabases:
    """The session's fed databases: built on first use, copied for every test."""

    def __init__(self, base: Path, shared: Path | None = None) -> None:
        self.base = base
        # where the SQLite masters are built: the folder every xdist worker of the session sees
        self.shared = shared if shared is not None else shared_folder(base)
        self._sqlite: dict[str, Path] = {}
        self._pg: dict[str, str] = {}
        self._migrated: Path | None = None

    def _master(self, key: str, build: Callable[[Path], Path]) -> Path:
        """The SQLite file `build(folder)` writes (and returns) for `key`, built once for all
        workers: under an exclusive lock on its own lock file, the first caller builds and
        checkpoints it and marks it done; a later caller (or another worker) finds it done."""
        folder = self.shared / key
        done = self.shared / f"{key}.done"
        self.shared.mkdir(parents=True, exist_ok=True)
        with open(self.shared / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way
                folder.mkdir(parents=True)
                path = build(folder)
                _checkpoint(path)
                done.write_text(str(path))
            return Path(done.read_text())

    def copy_migrated_sqlite(self, dest: Path) -> None:
        """Write a copy of an empty SQLite file migrated to all heads to dest: the migration runs
        once per session, not once per test (the app's start-up upgrade then finds it at head)."""
        if self._migrated is None:
            self._migrated = self._master("migrated", _migrated_sqlite)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self._migrated, dest)

    def copy_sqlite(self, feed: Feed, dest: Path) -> None:
        """Write a copy of feed's fed SQLite file to dest (built first if this is the first ask)."""
        master = self._sqlite.get(feed.name)
        if master is None:
            master = self._master("feed-" + re.sub(r"\W", "_", feed.name), lambda d: _fed_sqlite(feed, d))
            self._sqlite[feed.name] = master
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(master, dest)

    def new_postgres(self, cluster: Any, feed: Feed) -> str:
        """A new database on cluster that is a copy of feed's fed database; returns its name."""
        template = self._pg.get(feed.name)
        if template is None:
            master = self.base / "pg-source" / f"{feed.name}.db"
            self.copy_sqlite(feed, master)
            template = cluster.new_database(prefix="fed_" + re.sub(r"\W", "_", feed.name))
            copy_rows(f"sqlite:///{master}", cluster.url(template))
            self._pg[feed.name] = template
        return str(cluster.new_database(template=template))


def shared_folder(base: Path) -> Path:
    """The folder for databases every worker of the session may use. An xdist worker's temp
    folders live under <session root>/popen-<worker id>/ (base is one of them): their common
    parent is the session's. Outside xdist (or laid out otherwise) it is base itself."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and base.parent.name == f"popen-{worker}":
        return base.parent.parent / "fed-databases-shared"
    return base / "shared"


def _migrated_sqlite(folder: Path) -> Path:
    from app.storage.engine import open_database

    path = folder / "kvscope.db"
    open_database(f"sqlite:///{path}").dispose()
    return path


def _fed_sqlite(feed: Feed, folder: Path) -> Path:
    feed_database(feed, folder, None)
    return folder / "kvscope.db"


def _checkpoint(path: Path) -> None:
    """Fold the WAL into the database file, so a copy of the file alone is the whole database."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def copy_rows(src_url: str, dst_url: str) -> None:
    """Copy every row of the app's tables from the database at src_url into the migrated, empty
    database at dst_url, parents before children, then move dst's id sequences past the copied ids.
    A table the app's models do not describe must be empty in src (never silently dropped)."""
    from sqlalchemy import Integer, func, inspect, select, text

    import app.storage.ab_models
    import app.storage.alert_models
    import app.storage.controller_models
    import app.storage.rollup_models
    import app.storage.session_models
    import app.storage.sizing_models  # noqa: F401  (the models register their tables on Base)
    from app.storage.engine import make_engine
    from app.storage.models import Base

    src, dst = make_engine(src_url), make_engine(dst_url)
    try:
        tables = Base.metadata.sorted_tables
        known = {t.name for t in tables} | {"alembic_version"}
        with src.connect() as s:
            for name in set(inspect(src).get_table_names()) - known:
                n = s.execute(text(f'SELECT count(*) FROM "{name}"')).scalar_one()
                if n:
                    raise RuntimeError(f"table {name} has {n} rows but no model: add it to copy_rows")
        with src.connect() as s, dst.begin() as d:
            for table in tables:
                rows = [dict(r) for r in s.execute(select(table)).mappings()]
                for i in range(0, len(rows), 5000):
                    d.execute(table.insert(), rows[i : i + 5000])
            for table in tables:
                pk = list(table.primary_key.columns)
                if len(pk) == 1 and isinstance(pk[0].type, Integer):
                    top = d.execute(select(func.max(pk[0]))).scalar_one()
                    if top is not None:
                        d.execute(
                            text("SELECT setval(pg_get_serial_sequence(:t, :c), :v)"),
                            {"t": table.name, "c": pk[0].name, "v": int(top)},
                        )
    finally:
        src.dispose()
        dst.dispose()
