"""`kvscope backup` / `kvscope restore` (app/storage/backup.py): a consistent copy of a store that
agents keep pushing to, restored into a new data folder with every sample, user and token of the
copy's moment; refusals for a running app, a newer schema and bad input, each in one line."""

from __future__ import annotations

import json
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from app.ingest.parse import parse_batch
from app.storage.backup import backup, hold_serving_lock, restore, revisions_of
from app.storage.engine import open_database, script_revisions
from app.storage.ingest_store import IngestWriter, count_samples
from app.storage.tokens import create_token, lookup_token
from app.storage.users_store import create_user, user_by_name
from kvscope.cli import main
from kvscope.errors import UserError
from tests.conftest import make_batch

T0 = 1_780_000_000.0
PER_PUSH = 20  # samples in every push: a consistent copy holds whole pushes only


def push(writer: IngestWriter, seq: int) -> None:
    samples = [("vllm:prompt_tokens_total", {"model_name": "m", "engine": str(i)}, float(seq)) for i in range(PER_PUSH)]
    body = json.dumps(make_batch(seq, T0 + seq, samples=samples)).encode()
    batch = parse_batch(body, T0 + seq, max_future_skew_s=60, max_past_age_s=86400)
    writer.write(batch, T0 + seq)


def url_of(folder: Path) -> str:
    return f"sqlite:///{folder / 'kvscope.db'}"


def test_a_backup_taken_while_agents_push_restores_every_sample_user_and_token_of_its_moment(tmp_path: Path) -> None:
    live = url_of(tmp_path / "live")
    engine = open_database(live)
    create_user(engine, "alice", "operator", "argon2-hash", T0)
    token = create_token(engine, "rig1", T0, host="rig1")
    writer = IngestWriter(engine)
    for seq in range(1, 51):
        push(writer, seq)
    stop = threading.Event()
    pushed = [50]

    def keep_pushing() -> None:
        while not stop.is_set() and pushed[0] < 2000:
            pushed[0] += 1
            push(writer, pushed[0])

    pusher = threading.Thread(target=keep_pushing)
    pusher.start()
    try:
        while pushed[0] < 80:  # the backup starts while pushes are landing
            threading.Event().wait(0.01)
        result = backup(live, tmp_path / "copy.db")
    finally:
        stop.set()
        pusher.join()
    assert stat.S_IMODE(result.path.stat().st_mode) == 0o600
    assert result.revisions == tuple(sorted(revisions_of(tmp_path / "copy.db")))

    restored = url_of(tmp_path / "new")
    assert restore(result.path, restored, script_revisions(), T0) is None
    copy = open_database(restored)
    n = count_samples(copy)
    assert n % PER_PUSH == 0 and 50 * PER_PUSH <= n <= pushed[0] * PER_PUSH  # whole pushes, none torn
    assert user_by_name(copy, "alice") is not None
    info = lookup_token(copy, token)
    assert info is not None and info.host == "rig1"

    # the agents resend what the copy lacks: every push lands exactly once
    again = IngestWriter(copy)
    for seq in range(1, pushed[0] + 1):
        push(again, seq)
    assert count_samples(copy) == count_samples(engine) == pushed[0] * PER_PUSH


def test_restore_is_refused_while_an_app_serves_the_database(tmp_path: Path) -> None:
    live = url_of(tmp_path / "live")
    open_database(live).dispose()
    backup(live, tmp_path / "copy.db")
    hold_serving_lock(live)  # what `kvscope serve`, `up` and `demo` hold
    with pytest.raises(UserError, match="a kvscope app is serving"):
        restore(tmp_path / "copy.db", live, script_revisions(), T0)


def test_a_backup_from_a_newer_schema_is_refused_and_nothing_is_replaced(tmp_path: Path) -> None:
    live = url_of(tmp_path / "live")
    open_database(live).dispose()
    backup(live, tmp_path / "copy.db")
    with sqlite3.connect(tmp_path / "copy.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0099_future'")
    before = (tmp_path / "live" / "kvscope.db").read_bytes()
    with pytest.raises(UserError, match=r"newer kvscope .*0099_future"):
        restore(tmp_path / "copy.db", live, script_revisions(), T0)
    assert (tmp_path / "live" / "kvscope.db").read_bytes() == before


def test_restore_keeps_the_database_it_replaces(tmp_path: Path) -> None:
    first = url_of(tmp_path / "a")
    engine = open_database(first)
    create_user(engine, "bob", "viewer", "h", T0)
    backup(first, tmp_path / "with-bob.db")
    create_user(engine, "carol", "viewer", "h", T0)
    engine.dispose()
    kept = restore(tmp_path / "with-bob.db", first, script_revisions(), T0)
    assert kept is not None and stat.S_IMODE(kept.stat().st_mode) == 0o600
    now = open_database(first)
    assert user_by_name(now, "bob") is not None and user_by_name(now, "carol") is None
    assert user_by_name(open_database(f"sqlite:///{kept}"), "carol") is not None


@pytest.mark.parametrize(
    "argv,message",
    [
        (["backup", "{tmp}/no/such/folder/x.db"], "does not exist"),
        (["backup", "--database-url", "postgresql://u@127.0.0.1/kvscope", "{tmp}/x.db"], "pg_dump"),
        (["restore", "{tmp}/missing.db"], "no backup file"),
        (["restore", "{tmp}/garbage.db"], "not a"),
    ],
)
def test_bad_backup_and_restore_input_gets_a_one_line_error(
    tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    open_database(url_of(tmp_path / "data")).dispose()
    (tmp_path / "garbage.db").write_bytes(b"not sqlite at all" * 100)
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc = main([args[0], "--data-dir", str(tmp_path / "data"), *args[1:]])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and message in err and len(err.splitlines()) == 1, err


def test_the_cli_backs_up_and_restores_into_a_new_data_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = open_database(url_of(tmp_path / "data"))
    create_user(engine, "dora", "admin", "h", T0)
    assert main(["backup", "--data-dir", str(tmp_path / "data"), str(tmp_path / "b.db")]) == 0
    assert "backed up to" in capsys.readouterr().out
    assert main(["restore", "--data-dir", str(tmp_path / "fresh"), str(tmp_path / "b.db")]) == 0
    assert user_by_name(open_database(url_of(tmp_path / "fresh")), "dora") is not None
