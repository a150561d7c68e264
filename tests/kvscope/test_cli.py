"""The console script: help, expected failures as one line (no traceback), tokens."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.cli import main


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kvscope", *args], capture_output=True, text=True, env=full_env, timeout=120
    )


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kvscope: error: ")
    return lines[0]


def test_help_lists_serve_and_token(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "serve" in out and "token" in out


def test_serve_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = _one_line_error(_run("serve", "--data-dir", str(tmp_path), "--port", str(port)))
    assert "in use" in line and "--port" in line


def test_serve_unwritable_data_dir(tmp_path: Path) -> None:
    line = _one_line_error(_run("serve", "--data-dir", "/proc/kvscope-nope", "--port", "1"))
    assert "KVSCOPE_DATA_DIR" in line


def test_serve_bad_setting_from_env(tmp_path: Path) -> None:
    line = _one_line_error(_run("serve", "--data-dir", str(tmp_path), env={"KVSCOPE_PORT": "eighty"}))
    assert "port" in line


def test_serve_refuses_placeholder_secret_off_loopback(tmp_path: Path) -> None:
    line = _one_line_error(_run("serve", "--data-dir", str(tmp_path), "--host", "0.0.0.0", "--port", "1"))
    assert "KVSCOPE_SECRET_KEY" in line


def test_serve_bad_database_url(tmp_path: Path) -> None:
    line = _one_line_error(_run("serve", "--database-url", "notadb://x", "--port", "1"))
    assert "database" in line.lower()


def test_token_create_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path)
    assert main(["token", "create", "rig1", "--data-dir", d]) == 0
    tok = capsys.readouterr().out.strip()
    assert tok.startswith("kvs_") and len(tok) > 40
    assert main(["token", "create", "rig1", "--data-dir", d]) == 2  # duplicate name: one-line error
    assert "exists already" in capsys.readouterr().err
    assert main(["token", "list", "--data-dir", d]) == 0
    listed = capsys.readouterr().out
    assert "rig1" in listed and tok not in listed  # never shows the secret again
    assert main(["token", "revoke", "rig1", "--data-dir", d]) == 0
    assert main(["token", "revoke", "rig1", "--data-dir", d]) == 2


def test_each_command_module_registers_exactly_the_names_the_table_gives_it() -> None:
    import argparse

    from kvscope.cli import COMMANDS

    for names, load in COMMANDS:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        load().register(sub)
        assert tuple(sub.choices) == names, load


def test_the_agents_entry_point_imports_only_the_agent() -> None:
    import json
    import subprocess
    import sys

    code = (
        "import sys, json\n"
        "from kvscope.cli import main\n"
        "try:\n    main(['agent', '--help'])\nexcept SystemExit:\n    pass\n"
        "mods = sorted(m for m in sys.modules if m.split('.')[0] in ('app', 'simulator', 'kvscope', 'agent'))\n"
        "print(json.dumps(mods), file=sys.stderr)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    mods = json.loads(p.stderr.strip().splitlines()[-1])
    foreign = [m for m in mods if m.split(".")[0] in ("app", "simulator") or m in ("kvscope.demo", "kvscope.up")]
    assert foreign == [] and "agent.cli" in mods, mods
