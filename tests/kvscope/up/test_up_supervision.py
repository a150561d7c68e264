"""`kvscope up -- CMD` supervises its server: a SIGKILLed server comes back (a restart event on
the instance), SIGTERM stops the server, then kvscope; and bad input is one line, exit 2, nothing
started: a command not on PATH, an empty `--`, the app's port in use, the server's port held by a
process kvscope cannot adopt."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kvscope.up.rig import KVSCOPE, UpRig, env_with_kvscope_on_path, sim_listening
from tests.ports import free_port
from tests.waits import wait_until

SIM = ["kvscope", "sim", "--profile", "rtx4070-qwen3-4b", "--port", "{SIM_PORT}", "--uvicorn-log-level", "warning"]


def _up(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVSCOPE, "up", "--no-gpu", "--data-dir", str(tmp_path / "data"), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env_with_kvscope_on_path(),
    )


def _one_line(cp: subprocess.CompletedProcess[str]) -> str:
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr and cp.stdout == ""
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1, cp.stderr
    return lines[0]


@pytest.fixture
def listener() -> Iterator[int]:
    """A port held by this test process (not a server kvscope started, not one it can adopt)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_command_not_on_path_is_one_line(tmp_path: Path) -> None:
    cp = _up(tmp_path, "--port", str(free_port()), "--", "nosuchvllm", "serve", "x")
    assert _one_line(cp) == "kvscope up: cannot start 'nosuchvllm': not found on PATH"
    assert not (tmp_path / "data" / "logs").exists()


def test_an_empty_dash_dash_is_one_line(tmp_path: Path) -> None:
    line = _one_line(_up(tmp_path, "--port", str(free_port()), "--"))
    assert line.startswith("kvscope up: nothing after `--`") and "kvscope up -- vllm serve MODEL" in line


def test_a_server_port_that_is_no_port_is_one_line(tmp_path: Path) -> None:
    line = _one_line(_up(tmp_path, "--port", str(free_port()), "--", "kvscope", "sim", "--port", "80x"))
    assert line == "kvscope up: --port '80x' in the server command is not a port number"


def test_the_apps_port_in_use_is_one_line(tmp_path: Path, listener: int) -> None:
    line = _one_line(_up(tmp_path, "--port", str(listener), "--", *[a.replace("{SIM_PORT}", "1") for a in SIM]))
    assert line.startswith(f"kvscope up: the app's port {listener} on 127.0.0.1 is in use")
    assert "kvscope's own --port goes before `--`" in line


def test_the_servers_port_held_by_another_process_is_one_line_and_nothing_starts(tmp_path: Path, listener: int) -> None:
    app_port = free_port()
    line = _one_line(
        _up(tmp_path, "--port", str(app_port), "--", *[a.replace("{SIM_PORT}", str(listener)) for a in SIM])
    )
    assert line.startswith(f"kvscope up: port {listener} is in use by pid {os.getpid()}")
    assert "kvscope did not start and cannot adopt: not starting a second server on it" in line
    assert list((tmp_path / "data" / "logs").glob("*.log")) == []  # no server was started


@pytest.mark.slow
def test_a_killed_server_is_restarted_and_sigterm_stops_it_then_kvscope(tmp_path: Path) -> None:
    rig = UpRig(tmp_path, SIM)
    try:
        rig.wait_ready()
        iid = int(rig.instance()["id"])
        first = rig.pid_file()["pid"]
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: rig.pid_file()["pid"] != first and sim_listening(rig.sim_url), "a restarted server", 60)

        def restart_event() -> object:
            evs = rig.get("/api/v1/events", instance=iid)["events"]
            return [e for e in evs if e["kind"] == "restart" and "restarted by kvscope" in e["message"]]

        (ev,) = wait_until(restart_event, "the supervisor's restart event", timeout=60)
        assert "killed by SIGKILL" in ev["message"] and "restart 1 in a row" in ev["message"]
        html = httpx.get(f"{rig.app_url}/instances/{iid}", headers=rig.auth, timeout=20).text
        assert "restarted by kvscope" in html  # the instance page shows the restart
        page = rig.get("/api/v1/instances")["instances"]
        assert [i["id"] for i in page if i["url"] == rig.sim_url] == [iid]  # the same instance, not a new one
        second = rig.pid_file()["pid"]
        logs = rig.data / "logs"
        assert stat.S_IMODE(logs.stat().st_mode) == 0o700
        assert len(list(logs.glob("server-*.log"))) == 2  # one per start
        assert {stat.S_IMODE(p.stat().st_mode) for p in logs.iterdir()} == {0o600}
    finally:
        rc = rig.stop(signal.SIGTERM)
    assert rc == 0, rig.output()
    assert not sim_listening(rig.sim_url)
    wait_until(lambda: _gone(second), "the restarted server gone", timeout=10)
    assert "kvscope up: stopped" in rig.output()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--stop-timeout", "0"], "kvscope up: --stop-timeout must be between 0 and 3600 seconds"),
        (["--stop-timeout", "3601"], "kvscope up: --stop-timeout must be between 0 and 3600 seconds"),
        (
            ["--vllm-url", "http://127.0.0.1:1", "--vllm-url", "http://127.0.0.1:2"],
            "kvscope up: with `--`, give at most one --vllm-url: the URL of the server the command starts",
        ),
    ],
)
def test_out_of_range_up_options_with_a_server_command_are_one_line(tmp_path: Path, argv: list[str], said: str) -> None:
    cp = _up(tmp_path, "--port", str(free_port()), *argv, "--", *[a.replace("{SIM_PORT}", "1") for a in SIM])
    assert _one_line(cp) == said


# A server (and a child of it) that ignore SIGTERM; its `--help` run (the controller's preflight
# reads it) hangs the same way. Every process of it carries the marker path in its command line.
STUBBORN = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)', sys.argv[1]]); "
    "'--help' in sys.argv or open(sys.argv[1], 'w').write(str(child.pid)); time.sleep(600)"
)


@pytest.mark.slow
def test_ctrl_c_kills_a_server_that_ignores_sigterm_its_children_and_its_help_run(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    rig = UpRig(
        tmp_path, ["python3", "-c", STUBBORN, str(marker), "--port", "{SIM_PORT}"], up_args=["--stop-timeout", "1"]
    )
    try:
        rig.wait_ready()
        wait_until(lambda: marker.exists() and marker.read_text(), "the server's child", timeout=60)
        wait_until(lambda: len(_marked(str(marker))) >= 4, "the server, its child and the --help run", timeout=60)
    finally:
        rc = rig.stop(signal.SIGINT)
    assert rc == 0, rig.output()
    assert "stopping the server (SIGTERM, then SIGKILL after 1 s)" in rig.output()
    wait_until(lambda: _marked(str(marker)) == [], "every process of the server gone", timeout=15)


def _marked(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (zombies waiting for init are gone)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmd and state != "Z":
            out.append(int(entry))
    return out


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
