"""`kvscope service install|uninstall`: systemd units that pass `systemd-analyze verify`, with a
restart policy, the data folder, and secrets only in a 0600 environment file; one-line errors for
a unit folder that cannot be written and for a control character bound for the unit."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from kvscope.cli import main

ANALYZE = shutil.which("systemd-analyze")


def _install(tmp_path: Path, *argv: str) -> int:
    # options first: everything after `--` is the command's own
    return main(["service", "install", "--unit-dir", str(tmp_path / "units"), "--data-dir", str(tmp_path / "d"), *argv])


@pytest.mark.parametrize("role", ["app", "up", "agent"])
def test_each_unit_passes_systemd_analyze_verify_and_keeps_its_secret_in_a_0600_file(
    tmp_path: Path, role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_AGENT_TOKEN", "kvs_" + "a" * 40)
    extra = ["--", "--server", "http://central:8080", "--vllm-url", "http://127.0.0.1:8000"] if role == "agent" else []
    assert _install(tmp_path, role, *extra) == 0
    unit = tmp_path / "units" / f"kvscope-{role}.service"
    env = tmp_path / "units" / f"kvscope-{role}.env"
    text = unit.read_text()
    assert "Restart=on-failure" in text and f"EnvironmentFile={env}" in text
    assert "kvs_" not in text and "SECRET" not in text  # secrets never in the unit (world-readable, ps)
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert f"KVSCOPE_DATA_DIR={tmp_path / 'd'}" in env.read_text()
    assert ("KVSCOPE_AGENT_TOKEN=" if role == "agent" else "KVSCOPE_SECRET_KEY=") in env.read_text()
    if role == "agent":
        assert "--server http://central:8080 --vllm-url http://127.0.0.1:8000" in text
    if ANALYZE is None:
        pytest.skip("systemd-analyze is not installed: the unit was written, not verified")
    r = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_second_install_keeps_the_secret_key_so_sessions_survive(tmp_path: Path) -> None:
    assert _install(tmp_path, "up") == 0
    first = (tmp_path / "units" / "kvscope-up.env").read_text()
    assert _install(tmp_path, "up", "--", "--port", "9090") == 0
    assert (tmp_path / "units" / "kvscope-up.env").read_text() == first
    assert "--port 9090" in (tmp_path / "units" / "kvscope-up.service").read_text()


def test_print_shows_the_unit_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _install(tmp_path, "app", "--print") == 0
    out = capsys.readouterr().out
    assert "[Service]" in out and "KVSCOPE_SECRET_KEY=<set>" in out
    assert not (tmp_path / "units").exists()


def test_uninstall_removes_the_unit_and_its_env_file(tmp_path: Path) -> None:
    assert _install(tmp_path, "app") == 0
    assert main(["service", "uninstall", "app", "--unit-dir", str(tmp_path / "units")]) == 0
    assert list((tmp_path / "units").iterdir()) == []


def test_an_agent_unit_without_a_token_in_the_environment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KVSCOPE_AGENT_TOKEN", raising=False)
    assert _install(tmp_path, "agent") != 0
    err = capsys.readouterr().err.strip()
    assert "KVSCOPE_AGENT_TOKEN" in err and len(err.splitlines()) == 1


def test_a_unit_folder_that_cannot_be_written_gets_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "units").write_text("a file, not a folder")
    assert _install(tmp_path, "app") != 0
    err = capsys.readouterr().err.strip()
    assert "cannot write to" in err and len(err.splitlines()) == 1


def test_a_carriage_return_bound_for_the_unit_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _install(tmp_path, "up", "--", "--vllm-url", "http://x\r\nExecStartPre=/bin/sh") != 0
    assert "control character" in capsys.readouterr().err
    assert not (tmp_path / "units" / "kvscope-up.service").exists()


def test_up_takes_the_dash_dash_server_command_in_both_forms_with_its_full_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "vllm").write_text("#!/bin/sh\n")
    (bin_dir / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    unit = tmp_path / "units" / "kvscope-up.service"
    # with up options: a second `--` starts the server's command, kept in the unit
    assert _install(tmp_path, "up", "--", "--port", "9090", "--", "vllm", "serve", "m", "--port", "8001") == 0
    text = unit.read_text()
    assert f" up --port 9090 -- {bin_dir / 'vllm'} serve m --port 8001\n" in text
    assert f"WorkingDirectory={tmp_path}\n" in text and "KillMode=mixed\n" in text
    # without: the command right after the first `--`
    assert _install(tmp_path, "up", "--", "vllm", "serve", "m") == 0
    assert f" up -- {bin_dir / 'vllm'} serve m\n" in unit.read_text()
    if ANALYZE is not None:
        r = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_up_with_a_server_command_not_on_path_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _install(tmp_path, "up", "--", "nosuchvllm", "serve", "m") == 2
    err = capsys.readouterr().err.strip()
    assert err == "kvscope: error: cannot find 'nosuchvllm' for the unit: not found on PATH; give its full path"
    assert not (tmp_path / "units").exists()


@pytest.mark.parametrize(
    "argv,command",
    [
        (
            ["up", "--print", "--user", "--", "--vllm-url", "http://127.0.0.1:8000"],
            "up --vllm-url http://127.0.0.1:8000",
        ),
        (["agent", "--print", "--", "--server", "http://c:8080"], "agent --server http://c:8080"),
    ],
)
def test_options_between_the_role_and_the_dashes_are_the_installers_and_the_rest_goes_to_the_unit(
    argv: list[str], command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The form docs/operations.md gives (`install up --user -- --vllm-url ...`) was refused: argparse
    filled the trailing arguments at the role, before the options."""
    monkeypatch.setenv("KVSCOPE_AGENT_TOKEN", "kvs_" + "a" * 40)
    assert main(["service", "install", *argv]) == 0
    [exec_start] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ExecStart=")]
    assert exec_start.endswith(f"-m kvscope {command}")


def test_an_unknown_option_before_the_dashes_is_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["service", "install", "app", "--print", "--bogus", "--", "--port", "9"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


@pytest.mark.parametrize("role,kill_mode", [("agent", "KillMode=process"), ("app", None)])
def test_a_unit_that_supervises_vllm_leaves_it_serving_when_its_main_process_crashes(
    tmp_path: Path, role: str, kill_mode: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemd's default KillMode kills the whole unit when the agent dies, vLLM included: the
    restarted agent could never adopt it (tests/rig/test_agent_killed.py runs the adoption)."""
    monkeypatch.setenv("KVSCOPE_AGENT_TOKEN", "kvs_" + "a" * 40)
    extra = ["--", "--server", "http://central:8080"] if role == "agent" else []
    assert _install(tmp_path, role, *extra) == 0
    text = (tmp_path / "units" / f"kvscope-{role}.service").read_text()
    modes = [line for line in text.splitlines() if line.startswith("KillMode=")]
    assert modes == ([kill_mode] if kill_mode else [])
    assert "KillSignal=SIGINT" in text  # the clean stop still reaches the agent, which stops vLLM
