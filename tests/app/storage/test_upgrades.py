"""Upgrades: a database made at every earlier revision (0001 ... the one before the head), with
samples pushed into it then, is migrated to the head and read back through the API; a database a
newer kvscope wrote is refused with one clear line and left as it was."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from app.ingest.parse import parse_batch
from app.storage.engine import make_engine, migrations_dir, open_database, upgrade
from app.storage.ingest_store import IngestWriter
from kvscope.errors import UserError
from tests.app.dashboard.recorded import opened_app
from tests.conftest import make_batch

T0 = 1_780_000_000.0


def _earlier_revisions() -> list[str]:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    script = ScriptDirectory.from_config(cfg)
    [head] = script.get_heads()
    return [r.revision for r in reversed(list(script.walk_revisions())) if r.revision != head]


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database at the head with 30 pushes in it, written by today's ingest."""
    db = tmp_path_factory.mktemp("pushed") / "kvscope.db"
    engine = open_database(f"sqlite:///{db}")
    writer = IngestWriter(engine)
    for seq in range(1, 31):
        body = json.dumps(make_batch(seq, T0 + 10 * seq)).encode()
        writer.write(parse_batch(body, T0 + 10 * seq, max_future_skew_s=60, max_past_age_s=86400), T0 + 10 * seq)
    engine.dispose()
    return db


def _copy_rows(source: Path, target: Path) -> int:
    """The rows of every table the target's schema has, in the columns it has: the data an older
    kvscope held at that revision (hosts, instances, series, samples ... and what came later)."""
    copied = 0
    with sqlite3.connect(target) as conn:
        conn.execute("ATTACH DATABASE ? AS src", (str(source),))
        tables = [r[0] for r in conn.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")]
        for table in tables:
            if table == "alembic_version":
                continue
            mine = [r[1] for r in conn.execute(f"PRAGMA main.table_info({table})")]
            theirs = {r[1] for r in conn.execute(f"PRAGMA src.table_info({table})")}
            cols = ", ".join(c for c in mine if c in theirs)
            if cols:
                copied += conn.execute(f"INSERT INTO main.{table} ({cols}) SELECT {cols} FROM src.{table}").rowcount
    return copied


@pytest.mark.parametrize("revision", _earlier_revisions())
def test_a_database_made_at_an_earlier_revision_with_data_is_upgraded_and_read_back(
    tmp_path: Path, revision: str, pushed: Path
) -> None:
    db = tmp_path / "kvscope.db"
    old = make_engine(f"sqlite:///{db}")
    upgrade(old, revision)
    old.dispose()
    assert _copy_rows(pushed, db) > 30

    with opened_app(tmp_path, lambda: T0 + 310) as (_app, client):
        [inst] = client.get("/api/v1/instances").json()["instances"]
        assert inst["url"] == "http://127.0.0.1:8000"
        got = client.get(
            "/api/v1/series",
            params={"instance": inst["id"], "metric": "vllm:prompt_tokens_total", "start": T0, "end": T0 + 300},
        )
        assert got.status_code == 200, got.text
        [trace] = got.json()["series"]
        rates = [v for _, v in trace["points"] if v is not None]
        assert rates and all(abs(v - 10.0) < 1e-6 for v in rates)  # 100 tokens per 10 s push


def test_a_database_written_by_a_newer_kvscope_is_refused_and_left_untouched(tmp_path: Path) -> None:
    db = tmp_path / "kvscope.db"
    open_database(f"sqlite:///{db}").dispose()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0099_future'")
    before = db.read_bytes()
    with pytest.raises(UserError, match="newer kvscope") as refused:
        open_database(f"sqlite:///{db}")
    assert "0099_future" in str(refused.value) and "\n" not in str(refused.value)
    assert db.read_bytes() == before
