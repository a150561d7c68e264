"""`kvscope backup FILE` and `kvscope restore FILE`. Module level imports stay stdlib-only (see
kvscope.cli); the work is app/storage/backup.py."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from app.cli import add_settings_args, settings_from_args


def register(sub: Any) -> None:
    b = sub.add_parser(
        "backup",
        help="copy the SQLite store to FILE while kvscope runs (consistent, 0600; PostgreSQL: pg_dump)",
    )
    add_settings_args(b)
    b.add_argument("file", help="where to write the backup")
    b.set_defaults(func=run_backup)
    r = sub.add_parser(
        "restore",
        help="replace the SQLite store with a backup (the app must be stopped; the old store is kept)",
    )
    add_settings_args(r)
    r.add_argument("file", help="a file written by `kvscope backup`")
    r.set_defaults(func=run_restore)


def run_backup(args: argparse.Namespace) -> int:
    from app.storage.backup import backup

    settings = settings_from_args(args)
    result = backup(settings.effective_database_url, Path(args.file))
    print(
        f"kvscope: backed up to {result.path} ({result.bytes / 1e6:.1f} MB, schema {', '.join(result.revisions)}, "
        f"{result.seconds:.1f} s)"
    )
    return 0


def run_restore(args: argparse.Namespace) -> int:
    from app.storage.backup import restore, sqlite_path
    from app.storage.engine import open_database, script_revisions

    settings = settings_from_args(args)
    url = settings.effective_database_url
    kept = restore(Path(args.file), url, script_revisions(), time.time())
    open_database(url).dispose()  # an older backup is migrated to this kvscope's schema now
    print(f"kvscope: restored {args.file} into {sqlite_path(url)}")
    if kept is not None:
        print(f"kvscope: the database it replaced is kept as {kept}")
    return 0
