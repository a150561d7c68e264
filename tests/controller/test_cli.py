"""`kvscope profile ...` and `kvscope apply` against the app's database."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvscope.cli import main


def _db(tmp_path: Path) -> list[str]:
    return ["--data-dir", str(tmp_path / "data")]


def test_profile_commands(tmp_path: Path, capsys: Any) -> None:
    db = _db(tmp_path)
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
    from agent.protocol import PushBatch, Scrape
    from app.settings import load_settings
    from app.storage.engine import open_database
    from app.storage.ingest_store import IngestWriter
    from app.storage.series_store import list_instances

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


def test_apply_wait_exit_codes(tmp_path: Path, capsys: Any) -> None:
    db = _db(tmp_path)
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
        for _ in range(100):
            if rs.claim_for_host(eng, host_id, "a", time.time()):
                break
            time.sleep(0.05)
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
def test_apply_unknown_instance(tmp_path: Path, ref: str) -> None:
    _seed_instance(tmp_path)
    assert main(["apply", "--instance", ref, "--profile", "x", *_db(tmp_path)]) == 2
