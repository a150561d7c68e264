"""What a test's app database holds, read the way the app reads it: raw samples through the
store's reader (app/storage/chunk_reads.py: the head table and the chunks the sealing job moved
older samples into), never the head table alone; and agent tokens made by the real CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# `kvscope token create` for several tokens in one interpreter: one Python start-up, not one each
CLI_EACH = """
import json, sys
from kvscope.cli import main
for argv in json.loads(sys.argv[1]):
    rc = main(argv)
    if rc:
        sys.exit(rc)
"""


def raw_points(db: Path, ids: Iterable[int], *, seconds: bool = False) -> dict[int, list[Any]]:
    """Every raw point of the series `ids`, on a read-only connection to the database file."""
    from sqlalchemy import create_engine

    from app.storage import chunk_reads

    engine = create_engine(f"sqlite:///file:{db}?mode=ro&uri=true", connect_args={"timeout": 20})
    try:
        with engine.connect() as conn:
            return chunk_reads.points(conn, dict.fromkeys(ids, (0, 2**62)), seconds=seconds)
    finally:
        engine.dispose()


def samples_stored_twice(db: Path) -> int:
    """Samples held beyond the distinct points the reader returns, over every series of the file.

    Both figures (and the series they cover) come from one read transaction: the app keeps
    running while a test checks, and a push landing between two separate reads would add head
    rows to the second figure only, reading as a sample stored twice."""
    from sqlalchemy import create_engine

    from app.storage import chunk_reads

    engine = create_engine(f"sqlite:///file:{db}?mode=ro&uri=true", connect_args={"timeout": 20})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("BEGIN")  # pysqlite opens none for SELECTs: one WAL snapshot from here
            ids = [int(sid) for (sid,) in conn.exec_driver_sql("SELECT id FROM series")]
            distinct = sum(len(p) for p in chunk_reads.points(conn, dict.fromkeys(ids, (0, 2**62))).values())
            held = chunk_reads.count(conn)
            conn.rollback()
        return held - distinct
    finally:
        engine.dispose()


def cli_tokens(env: dict[str, str], data: Path, creates: list[list[str]], timeout: float = 120) -> list[str]:
    """`kvscope token create <args> --data-dir data` for each of `creates`; the tokens printed."""
    argvs = [["token", "create", *args, "--data-dir", str(data)] for args in creates]
    out = subprocess.run(
        [sys.executable, "-c", CLI_EACH, json.dumps(argvs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=True,
    ).stdout
    found = re.findall(r"kvs_[A-Za-z0-9_\-]+", out)
    assert len(found) == len(creates), out
    return found
