"""The migration scripts have exactly one head, so `alembic upgrade head` means one thing and the
next migration has one revision to sit on (two heads were hidden once by `upgrade "heads"`)."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

from app.storage.engine import migrations_dir


def _scripts(location: Path) -> ScriptDirectory:
    cfg = Config()
    cfg.set_main_option("script_location", str(location))
    return ScriptDirectory.from_config(cfg)


def test_the_migration_scripts_have_exactly_one_head() -> None:
    heads = _scripts(migrations_dir()).get_heads()
    assert len(heads) == 1, f"migrations/versions has {len(heads)} heads {sorted(heads)}: add a merge revision"


def test_a_second_head_is_seen_by_the_check(tmp_path: Path) -> None:
    # the same check on a copy of the scripts with one more revision forked off the first one
    versions = tmp_path / "versions"
    versions.mkdir()
    src = migrations_dir()
    (tmp_path / "env.py").write_text((src / "env.py").read_text())
    if (src / "script.py.mako").exists():
        (tmp_path / "script.py.mako").write_text((src / "script.py.mako").read_text())
    for script in (src / "versions").glob("*.py"):
        (versions / script.name).write_text(script.read_text())
    (versions / "9999_fork.py").write_text(
        'revision = "9999_fork"\ndown_revision = "0001"\nbranch_labels = None\ndepends_on = None\n\n\n'
        "def upgrade() -> None:\n    pass\n\n\ndef downgrade() -> None:\n    pass\n"
    )
    assert len(_scripts(tmp_path).get_heads()) == 2
