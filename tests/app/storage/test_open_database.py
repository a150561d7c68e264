"""open_database: a database behind the scripts' heads is migrated to them; one already at the
heads is only checked, not handed to Alembic again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, text

import app.storage.engine as engine_mod
from app.storage.engine import make_engine, open_database, upgrade


def _heads(url: str) -> set[str]:
    eng = make_engine(url)
    try:
        with eng.connect() as conn:
            return {row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))}
    finally:
        eng.dispose()


def test_a_new_database_and_one_at_an_older_revision_are_migrated_to_the_heads(tmp_path: Path) -> None:
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    eng = open_database(fresh)
    tables = set(inspect(eng).get_table_names())
    eng.dispose()
    assert _heads(fresh) == engine_mod._script_heads() != set()

    older = f"sqlite:///{tmp_path / 'older.db'}"
    eng = make_engine(older)
    upgrade(eng, "0001")  # the first revision only
    assert set(inspect(eng).get_table_names()) < tables
    eng.dispose()
    eng = open_database(older)
    assert set(inspect(eng).get_table_names()) == tables
    eng.dispose()
    assert _heads(older) == engine_mod._script_heads()


@pytest.mark.both_databases
def test_a_database_at_the_heads_is_opened_without_an_alembic_run(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_upgrade(*_a: Any, **_k: Any) -> None:
        raise AssertionError("Alembic's upgrade ran on a database already at the heads")

    monkeypatch.setattr(engine_mod, "upgrade", no_upgrade)
    eng = open_database(db_url)  # db_url: a migrated database of the backend under test
    try:
        with eng.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM sizing_windows")).scalar() == 0
    finally:
        eng.dispose()
