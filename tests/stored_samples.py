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


def samples_held(db: Path) -> int:
    """The raw samples the store holds: head rows plus every chunk's count (a sample pushed again
    after its first copy was sealed is counted twice here, once by the reader)."""
    from sqlalchemy import create_engine

    from app.storage import chunk_reads

    engine = create_engine(f"sqlite:///file:{db}?mode=ro&uri=true", connect_args={"timeout": 20})
    try:
        with engine.connect() as conn:
            return chunk_reads.count(conn)
    finally:
        engine.dispose()


def samples_stored_twice(db: Path, series_ids: Iterable[int]) -> int:
    """Samples held beyond the distinct points the reader returns, over every series of the file."""
    distinct = sum(len(p) for p in raw_points(db, series_ids).values())
    return samples_held(db) - distinct


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
