"""`kvscope profile ...` and `kvscope apply` against the running app, over its JSON API.

The app runs for real (uvicorn on a loopback port, its own SQLite file); its operator token is
written to <data dir>/api-token as `kvscope up` does, and the CLI finds it there by itself.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvscope.app_client import find_token
from kvscope.cli import main
from kvscope.errors import UserError
from tests.agent.livesrv import LiveServer
from tests.ports import free_port
from tests.waits import wait_until


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    from app.auth.local_access import write_cli_token
    from app.main import create_app
    from app.settings import load_settings
    from app.storage.engine import open_database

    settings = load_settings(None, data_dir=str(tmp_path / "data"), run_scheduler=False)
    engine = open_database(settings.effective_database_url)
    write_cli_token(engine, settings.server.data_dir, time.time())
    srv = LiveServer(create_app(settings, engine=engine, start_jobs=False))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        engine.dispose()


def _db(tmp_path: Path, live: LiveServer | None = None) -> list[str]:
    """Where the CLI finds the app (--url) and its token (<data dir>/api-token)."""
    url = live.url if live is not None else f"http://127.0.0.1:{free_port()}"
    return ["--url", url, "--data-dir", str(tmp_path / "data")]


def test_profile_commands(tmp_path: Path, capsys: Any, live: LiveServer) -> None:
    db = _db(tmp_path, live)
    assert main(["profile", "create", "off8", *db, "--offload-size-gib", "8", "--note", "first"]) == 0
    assert "--kv-offloading-size 8 --kv-offloading-backend native" in capsys.readouterr().out
    assert main(["profile", "edit", "off8", *db, "--kv-cache-dtype", "fp8", "--unset", "offload_size_gib"]) == 0
    assert capsys.readouterr().out.strip() == "off8 v2: --kv-cache-dtype fp8"
    assert main(["profile", "list", *db]) == 0
    assert "off8\tv2\t--kv-cache-dtype fp8" in capsys.readouterr().out
    assert main(["profile", "show", "off8", *db, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [v["note"] for v in shown["versions"]] == ["", "first"]
    assert main(["profile", "create", "bad", *db, "--gpu-memory-utilization", "2"]) == 2
    assert "gpu_memory_utilization" in capsys.readouterr().err
    assert main(["profile", "create", "off8", *db]) == 2
    assert main(["profile", "show", "nope", *db]) == 2


def _seed_instance(tmp_path: Path) -> int:
    from app.settings import load_settings
    from app.storage.engine import open_database
    from app.storage.ingest_store import IngestWriter
    from app.storage.series_store import list_instances
    from kvcore.protocol import PushBatch, Scrape

    eng = open_database(load_settings(None, data_dir=str(tmp_path / "data")).effective_database_url)
    now = time.time()
    IngestWriter(eng).write(
        PushBatch(
            agent_id="a",
            host="h",
            seq=1,
            sent_at=now,
            scrapes=[Scrape(instance="http://127.0.0.1:8000", ts=now, ok=True)],
        ),
        now,
    )
    iid = int(list_instances(eng)[0]["id"])
    eng.dispose()
    return iid


def test_apply_wait_exit_codes(tmp_path: Path, capsys: Any, live: LiveServer) -> None:
    db = _db(tmp_path, live)
    iid = _seed_instance(tmp_path)
    assert main(["profile", "create", "fp8", *db, "--kv-cache-dtype", "fp8"]) == 0
    assert main(["apply", "--instance", "http://127.0.0.1:8000", "--profile", "fp8", *db]) == 0
    assert "rollout #1 requested" in capsys.readouterr().out
    assert main(["apply", "--instance", str(iid), "--profile", "fp8", *db]) == 2  # one in progress
    assert "in progress" in capsys.readouterr().err

    from app.settings import load_settings
    from app.storage import rollouts_store as rs
    from app.storage.engine import open_database

    eng = open_database(load_settings(None, data_dir=str(tmp_path / "data")).effective_database_url)
    host_id = 1

    def agent(rid: int, final: str) -> None:  # plays the agent: claims, then reports
        wait_until(lambda: rs.claim_for_host(eng, host_id, "a", time.time()), "the rollout to be claimed", timeout=5.0)
        for st in ("preflight", "restarting", final):
            rs.apply_update(
                eng, rollout_id=rid, host_id=host_id, state=st, ts=time.time(), message=st, data={}, now=time.time()
            )

    rs.finish_rollout(eng, 1, "cancelled", "test", time.time(), only_from=("requested",))
    t = threading.Thread(target=agent, args=(2, "healthy"))
    t.start()
    assert main(["apply", "--instance", str(iid), "--profile", "fp8", "--wait", *db]) == 0
    t.join()
    out = capsys.readouterr().out
    assert "restarting: restarting" in out and "rollout #2 healthy" in out
    t = threading.Thread(target=agent, args=(3, "rolled_back"))
    t.start()
    assert main(["apply", "--instance", str(iid), "--profile", "fp8", "--wait", *db]) == 1
    t.join()
    eng.dispose()


@pytest.mark.parametrize("ref", ["99", "http://nowhere:1"])
def test_apply_unknown_instance(tmp_path: Path, ref: str, live: LiveServer, capsys: Any) -> None:
    _seed_instance(tmp_path)
    assert main(["apply", "--instance", ref, "--profile", "x", *_db(tmp_path, live)]) == 2
    assert "instance" in capsys.readouterr().err


def test_without_a_running_app_the_cli_says_how_to_reach_one(tmp_path: Path, capsys: Any) -> None:
    assert main(["profile", "list", *_db(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the kvscope app" in err and "--url" in err


def test_a_missing_or_wrong_token_is_explained(tmp_path: Path, capsys: Any, live: LiveServer) -> None:
    (tmp_path / "data" / "api-token").unlink()
    assert main(["profile", "list", *_db(tmp_path, live)]) == 2
    err = capsys.readouterr().err
    assert "no API token" in err and "api-token" in err
    assert main(["profile", "list", *_db(tmp_path, live), "--token", "not-a-token"]) == 2
    assert "refused the token from --token" in capsys.readouterr().err


def test_the_token_comes_from_the_flag_then_the_environment_then_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ns = argparse.Namespace(token=None, config=None, data_dir=str(data), url=None)
    assert find_token(ns, env={}) == (None, str(data / "api-token"))
    (data / "api-token").write_text("from-file\n")
    assert find_token(ns, env={}) == ("from-file", str(data / "api-token"))
    assert find_token(ns, env={"KVSCOPE_TOKEN": "from-env"}) == ("from-env", "$KVSCOPE_TOKEN")
    ns.token = "from-flag"
    assert find_token(ns, env={"KVSCOPE_TOKEN": "from-env"}) == ("from-flag", "--token")
    ns.token = None
    (data / "api-token").write_text("x" * 5000)  # not one token: refused with a message, never sent
    with pytest.raises(UserError, match="does not hold one API token"):
        find_token(ns, env={})
    (data / "api-token").write_text("two tokens\n")
    with pytest.raises(UserError, match="does not hold one API token"):
        find_token(ns, env={})


def test_without_a_data_dir_the_demos_token_is_found(tmp_path: Path, monkeypatch: Any) -> None:
    """`kvscope demo` keeps its data in <default data dir>/demo; a CLI run with no --data-dir and
    no token file of the default data dir uses the demo's."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("KVSCOPE_DATA_DIR", raising=False)
    ns = argparse.Namespace(token=None, config=None, data_dir=None, url=None)
    assert find_token(ns, env={})[0] is None
    demo = tmp_path / "kvscope" / "demo"
    demo.mkdir(parents=True)
    (demo / "api-token").write_text("demo-token\n")
    assert find_token(ns, env={}) == ("demo-token", str(demo / "api-token"))
    (tmp_path / "kvscope" / "api-token").write_text("up-token\n")  # the default data dir's own wins
    assert find_token(ns, env={})[0] == "up-token"
