"""Engine creation (SQLite pragmas: WAL, busy timeout) and Alembic upgrade on start-up."""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

from agent.private_files import private_dir, tighten
from app.paths import migrations_dir
from kvscope.errors import UserError

SQLITE_BUSY_TIMEOUT_MS = 10_000


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    if not isinstance(dbapi_conn, sqlite3.Connection):
        return
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    """Create the engine; for SQLite make sure the folder exists and is writable."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise UserError(f"bad database URL {url!r}: {exc}") from None
    kwargs: dict[str, Any] = {"future": True}
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            path = Path(db)
            try:
                private_dir(path.parent)
            except OSError as exc:
                raise UserError(
                    f"cannot create the data folder {path.parent}: {exc.strerror}; "
                    "set KVSCOPE_DATA_DIR to a writable folder"
                ) from None
            if path.exists() and not _writable(path):
                raise UserError(
                    f"database file {path} is not writable; fix its permissions or set KVSCOPE_DATA_DIR"
                ) from None
            if not _writable(path.parent):
                raise UserError(f"data folder {path.parent} is not writable; set KVSCOPE_DATA_DIR") from None
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    else:
        kwargs["pool_pre_ping"] = True
        kwargs["pool_size"] = 10
        kwargs["max_overflow"] = 20
    try:
        engine = create_engine(url, **kwargs)
    except (NoSuchModuleError, ImportError) as exc:
        raise UserError(
            f"database URL {parsed.render_as_string()!r} needs a driver that is not installed "
            f"({exc}); for Postgres: pip install 'psycopg[binary]'"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _writable(path: Path) -> bool:
    import os

    return os.access(path, os.W_OK)


def _alembic_config() -> Any:
    """Alembic's configuration: the migration scripts of this install."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    return cfg


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Apply Alembic migrations up to `revision` on this engine."""
    from alembic import command

    cfg = _alembic_config()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    except OperationalError as exc:
        raise _cannot_open(exc) from None


def _cannot_open(exc: OperationalError) -> UserError:
    return UserError(f"cannot open or migrate the database: {exc.orig}")


@functools.cache
def script_revisions() -> frozenset[str]:
    """Every revision the migration scripts know (a stored revision outside it is from a newer kvscope)."""
    from alembic.script import ScriptDirectory

    return frozenset(r.revision for r in ScriptDirectory.from_config(_alembic_config()).walk_revisions())


@functools.cache
def _script_heads() -> frozenset[str]:
    """The head revisions of the migration scripts (read once per process: they do not change
    while it runs)."""
    from alembic.script import ScriptDirectory

    return frozenset(ScriptDirectory.from_config(_alembic_config()).get_heads())


def _stored_revisions(engine: Engine) -> frozenset[str]:
    """The revisions the database's version table holds (empty for a new database)."""
    from alembic.runtime.migration import MigrationContext

    try:
        with engine.connect() as conn:
            return frozenset(MigrationContext.configure(conn).get_current_heads())
    except OperationalError as exc:
        raise _cannot_open(exc) from None


def open_database(url: str) -> Engine:
    """The engine of `url`, its database migrated to the head revision. A database already at the
    head is only checked (one read of its version table), not handed to Alembic's upgrade run. One
    a newer kvscope wrote (a revision these scripts do not know) is refused, never touched."""
    engine = make_engine(url)
    stored = _stored_revisions(engine)
    if stored != _script_heads():
        unknown = sorted(stored - script_revisions())
        if unknown:
            engine.dispose()
            raise UserError(
                f"the database {engine.url.render_as_string()} was written by a newer kvscope (schema revision "
                f"{', '.join(unknown)}, unknown to this one): upgrade kvscope, or restore a backup taken "
                "before the upgrade (docs/operations.md)"
            )
        upgrade(engine)
    _keep_private(engine)
    return engine


def _keep_private(engine: Engine) -> None:
    """A SQLite file holds password and token hashes: 0600, with its WAL and shared-memory files
    (SQLite creates those with the database's mode; an older kvscope left the database 0644)."""
    db = engine.url.database
    if engine.url.get_backend_name() != "sqlite" or not db or db == ":memory:":
        return
    for suffix in ("", "-wal", "-shm", "-journal"):
        tighten(Path(db + suffix))
