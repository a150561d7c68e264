"""Backups and restores of the SQLite store, consistent while agents keep pushing.

`backup` copies a running database through SQLite's online backup API into a temporary file
beside the destination, checks the copy (`PRAGMA integrity_check`, its schema revision), makes it
0600 (it holds password and token hashes) and renames it into place, so a half-written backup never
carries the final name. `restore` refuses while an app serves the database (the serving lock
below), refuses a backup whose schema is newer than this kvscope's migrations, keeps the database
it replaces beside it (`<db>.before-restore-<time>`), and migrates an older backup to the head.
PostgreSQL stores are backed up with pg_dump (docs/operations.md): these functions say so.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sqlalchemy.engine import make_url

from agent.private_files import FILE_MODE, open_private, tighten
from kvscope.errors import UserError

# All pages in one step, inside one read transaction: in WAL mode writers go on meanwhile, and the
# copy is one snapshot. (A step-wise copy restarts whenever another connection writes, so under a
# push a second it might never finish on a large store.)
PAGES_PER_STEP = -1
BUSY_TIMEOUT_S = 30.0
PG_DUMP_HINT = (
    "this store is PostgreSQL: back it up with `pg_dump --format=custom -f FILE DBNAME` and restore "
    "with `pg_restore --clean --if-exists -d DBNAME FILE` (docs/operations.md)"
)


@dataclass(frozen=True)
class BackupResult:
    path: Path
    bytes: int
    revisions: tuple[str, ...]
    seconds: float


def sqlite_path(url: str) -> Path:
    """The database file of a SQLite URL; a UserError naming pg_dump for anything else."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        raise UserError(PG_DUMP_HINT)
    if not parsed.database or parsed.database == ":memory:":
        raise UserError("an in-memory database has nothing to back up")
    return Path(parsed.database)


def _lock_path(db: Path) -> Path:
    return db.with_name(db.name + ".lock")


_HELD: list[IO[bytes]] = []  # the serving locks this process holds until it exits


def hold_serving_lock(url: str) -> None:
    """Mark the SQLite store of `url` as served by this process until it exits (a shared lock:
    several `kvscope serve` may share one database). `restore` takes the lock exclusively, so it
    cannot replace a database under a running app. Nothing for PostgreSQL."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return
    db = Path(parsed.database)
    db.parent.mkdir(parents=True, exist_ok=True)
    f = open_private(_lock_path(db), "ab")
    fcntl.flock(f.fileno(), fcntl.LOCK_SH)
    _HELD.append(f)


def _readonly(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)


def revisions_of(db: Path) -> tuple[str, ...]:
    """The Alembic revisions stored in a SQLite file; a UserError when it is not a kvscope database."""
    try:
        with contextlib.closing(_readonly(db)) as conn:
            rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.DatabaseError as exc:
        raise UserError(f"{db} is not a kvscope database ({exc})") from None
    if not rows:
        raise UserError(f"{db} is not a kvscope database (no schema revision)")
    return tuple(sorted(str(r[0]) for r in rows))


def _check(db: Path) -> tuple[str, ...]:
    try:
        with contextlib.closing(_readonly(db)) as conn:
            verdict = conn.execute("PRAGMA integrity_check").fetchone()
    except sqlite3.DatabaseError as exc:
        raise UserError(f"{db} is not a SQLite database ({exc})") from None
    if not verdict or verdict[0] != "ok":
        raise UserError(f"{db} fails SQLite's integrity check: {verdict[0] if verdict else 'no answer'}")
    return revisions_of(db)


def _copy(src: sqlite3.Connection, dest: Path) -> None:
    with contextlib.closing(sqlite3.connect(dest)) as out:
        src.backup(out, pages=PAGES_PER_STEP)


def backup(url: str, dest: Path) -> BackupResult:
    """A consistent copy of the SQLite store of `url` in `dest` (0600), taken while it is in use."""
    db = sqlite_path(url)
    if not db.exists():
        raise UserError(f"no database at {db}: nothing to back up (check --data-dir / --database-url)")
    dest = dest.expanduser()
    if dest.exists() and dest.is_dir():
        raise UserError(f"{dest} is a folder: give the backup's file name")
    if not dest.parent.is_dir():
        raise UserError(f"folder {dest.parent} does not exist")
    if dest.resolve() == db.resolve():
        raise UserError("the backup cannot replace the database it copies")
    started = time.monotonic()
    tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    try:
        with open_private(tmp):  # created 0600 before SQLite writes a page into it
            pass
        try:
            with contextlib.closing(sqlite3.connect(db, timeout=BUSY_TIMEOUT_S)) as src:
                _copy(src, tmp)
        except sqlite3.Error as exc:
            raise UserError(f"cannot back up {db}: {exc}") from None
        revisions = _check(tmp)
        tighten(tmp, FILE_MODE)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return BackupResult(dest, dest.stat().st_size, revisions, time.monotonic() - started)


def restore(src: Path, url: str, known_revisions: frozenset[str], now: float) -> Path | None:
    """Put the backup `src` in place of the SQLite store of `url`. Returns where the replaced
    database was kept (None when there was none). The caller migrates the result to the head."""
    db = sqlite_path(url)
    src = src.expanduser()
    if not src.is_file():
        raise UserError(f"no backup file at {src}")
    revisions = _check(src)
    unknown = sorted(set(revisions) - known_revisions)
    if unknown:
        raise UserError(
            f"{src} was written by a newer kvscope (schema revision {', '.join(unknown)}, unknown here): "
            "upgrade kvscope first, then restore"
        )
    db.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(db):
        kept = None
        if db.exists():
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
            kept = db.with_name(f"{db.name}.before-restore-{stamp}")
            with contextlib.closing(sqlite3.connect(db, timeout=BUSY_TIMEOUT_S)) as live:
                _copy(live, kept)
            tighten(kept, FILE_MODE)
        tmp = db.with_name(f".{db.name}.restoring-{os.getpid()}")
        try:
            with open_private(tmp):
                pass
            with contextlib.closing(_readonly(src)) as conn:
                _copy(conn, tmp)
            for suffix in ("-wal", "-shm"):  # the old database's; the restored one starts clean
                with contextlib.suppress(FileNotFoundError):
                    Path(str(db) + suffix).unlink()
            os.replace(tmp, db)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return kept


@contextlib.contextmanager
def _exclusive(db: Path) -> Iterator[IO[bytes]]:
    f = open_private(_lock_path(db), "ab")
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"a kvscope app is serving {db}: stop it (kvscope serve / up / demo, or its service) first, "
                "then restore"
            ) from None
        yield f
    finally:
        f.close()
