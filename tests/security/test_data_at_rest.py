"""What kvscope keeps on disk is its owner's only: the data folder 0700; the database (password and
token hashes), the agent's spool and state, vLLM's logs and pid file 0600. A database an older
kvscope left 0644 is tightened when it is opened."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from agent.launcher.subprocess import SubprocessLauncher
from agent.loop import load_agent_id
from agent.spool import Spool
from app.storage.engine import open_database


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_data_folder_and_its_database_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data" / "kvscope"
    engine = open_database(f"sqlite:///{data / 'kvscope.db'}")
    with engine.begin() as conn:  # a write, so SQLite makes its WAL and shared-memory files
        conn.exec_driver_sql("CREATE TABLE probe (x INTEGER)")
    engine.dispose()
    assert mode(data) == 0o700
    for f in data.iterdir():
        assert mode(f) == 0o600, f"{f.name} is {oct(mode(f))}"


def test_a_database_an_older_kvscope_left_world_readable_is_tightened_on_open(tmp_path: Path) -> None:
    db = tmp_path / "kvscope.db"
    open_database(f"sqlite:///{db}").dispose()
    db.chmod(0o644)
    open_database(f"sqlite:///{db}").dispose()
    assert mode(db) == 0o600


def test_the_agents_spool_and_state_are_private(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "state" / "spool")
    spool.append(1, {"seq": 1})
    assert mode(tmp_path / "state" / "spool") == 0o700
    assert [mode(p) for p in (tmp_path / "state" / "spool").iterdir()] == [0o600]
    load_agent_id(tmp_path / "agent-state")
    assert mode(tmp_path / "agent-state") == 0o700
    assert all(mode(p) == 0o600 for p in (tmp_path / "agent-state").iterdir())


def test_vllms_log_and_pid_file_are_private(tmp_path: Path) -> None:
    launcher = SubprocessLauncher([sys.executable, "-c", "print('hello')"], log_dir=tmp_path / "logs")
    launcher.start([])
    launcher.stop()
    files = list((tmp_path / "logs").iterdir())
    assert files and mode(tmp_path / "logs") == 0o700
    assert all(mode(p) == 0o600 for p in files), {p.name: oct(mode(p)) for p in files}
