"""Launcher adoption after kill -9 of the agent (issue 14): the restarted agent adopts the running
server even when it was started through a console script (`vllm` runs as `python /venv/bin/vllm`),
and a port held by something it cannot adopt never gets a second server.

Recorded /proc tree: tests/agent/trees/adopt (see its README). Real processes: a tiny console-script
launcher around tests/app/controller/fake_server.py, started by an "agent" process killed with -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.controller import Controller, ManagedInstance
from agent.launcher import process_identity as pid_id
from agent.launcher.base import LauncherError
from agent.launcher.subprocess import SubprocessLauncher
from tests.app.controller.test_launchers import FAKE
from tests.paths import REPO
from tests.ports import free_port
from tests.waits import wait_until

TREE = REPO / "tests" / "agent" / "trees" / "adopt" / "proc"
BOOT = "0f4c2a1e-7d3b-4c59-9a61-2b7e8d0c5f13"
VLLM_ARGV = ["/opt/vllm/bin/vllm", "serve", "/models/Qwen3-4B-FP8", "--port", "8000"]


def _pidfile(log_dir: Path, name: str, **data: Any) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / f"{name}.pid.json").write_text(json.dumps(data))


# ---------------------------------------------------------------- recorded /proc tree
def test_a_console_script_cmdline_matches_its_argv_through_the_scripts_interpreter() -> None:
    cmd = pid_id.read_cmdline(4242, TREE) or []
    assert cmd[:2] == ["/opt/vllm/bin/python3.12", "/opt/vllm/bin/vllm"]

    def interp(script: str) -> str | None:
        return "/opt/vllm/bin/python3.12" if script == "/opt/vllm/bin/vllm" else None

    def resolve(program: str, _path: str | None) -> str | None:
        return "/opt/vllm/bin/vllm" if program in ("vllm", "/opt/vllm/bin/vllm") else None

    kw: dict[str, Any] = {"resolve": resolve, "interpreter": interp}
    assert cmd != [*VLLM_ARGV, "--kv-cache-dtype", "fp8"]  # what the old string comparison did
    assert pid_id.same_command(cmd, [*VLLM_ARGV, "--kv-cache-dtype", "fp8"], **kw)
    assert pid_id.same_command(cmd, ["vllm", *VLLM_ARGV[1:], "--kv-cache-dtype", "fp8"], **kw)
    assert pid_id.match_command(cmd, VLLM_ARGV, **kw) == 6  # the profile flags follow
    assert not pid_id.same_command(cmd, VLLM_ARGV, **kw)  # flags left over: not the whole command
    assert pid_id.match_command(cmd, ["/opt/vllm/bin/vllm", "serve", "/models/other"], **kw) is None
    foreign = pid_id.read_cmdline(5151, TREE) or []
    assert pid_id.match_command(foreign, VLLM_ARGV, **kw) is None


def test_the_pid_files_boot_and_start_time_identify_the_server(tmp_path: Path) -> None:
    _pidfile(
        tmp_path,
        "vllm",
        pid=4242,
        argv=["vllm", "serve", "/models/Qwen3-4B-FP8", "--port", "8000", "--kv-cache-dtype", "fp8"],
        extra_argv=["--kv-cache-dtype", "fp8"],
        boot_id=BOOT,
        start_ticks=123456,
    )
    la = SubprocessLauncher(["vllm", "serve"], log_dir=tmp_path, name="vllm", port=8000, proc_root=TREE)
    assert la.pid == 4242 and la.current_argv == ["--kv-cache-dtype", "fp8"]
    assert la.alive() is True and "same boot and start time" in (la.adoption or "")
    with pytest.raises(LauncherError, match="already running"):
        la.start([])


@pytest.mark.parametrize(("boot", "ticks"), [(BOOT, 999), ("another-boot", 123456)])
def test_a_reused_pid_is_not_adopted_and_its_port_is_not_started_on(tmp_path: Path, boot: str, ticks: int) -> None:
    _pidfile(tmp_path, "vllm", pid=5151, argv=["vllm", "serve"], extra_argv=[], boot_id=boot, start_ticks=ticks)
    la = SubprocessLauncher(["vllm", "serve"], log_dir=tmp_path, name="vllm", port=8001, proc_root=TREE)
    assert la.pid is None and la.adoption is None
    assert not (tmp_path / "vllm.pid.json").exists()  # it named another process
    with pytest.raises(LauncherError, match=r"port 8001 is in use by pid 5151 \(/usr/bin/python3 -m http.server"):
        la.start([])
    assert list(tmp_path.glob("vllm-*.log")) == []  # nothing was spawned


def test_a_free_port_in_the_tree_lets_the_start_go_ahead(tmp_path: Path) -> None:
    assert pid_id.port_use(8002, TREE).in_use is False
    assert pid_id.port_use(8000, TREE).leaders == [4242]  # the engine core's connection is no listener


# ---------------------------------------------------------------- real processes
def _console_script(tmp_path: Path) -> Path:
    """`fakevllm serve PORT [flags]`: a #! script like pip's console scripts, running FAKE."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "fakevllm"
    script.write_text(
        f"#!{sys.executable}\nimport runpy, sys\n"
        f"sys.argv = [{str(FAKE)!r}] + sys.argv[2:]\nrunpy.run_path({str(FAKE)!r}, run_name='__main__')\n"
    )
    script.chmod(0o755)
    return bindir


AGENT = """
import json, sys, time
from pathlib import Path
from agent.launcher.subprocess import SubprocessLauncher
cfg = json.loads(sys.argv[1])
la = SubprocessLauncher(cfg["argv"], log_dir=Path(cfg["logs"]), name="srv", env=cfg["env"], port=cfg["port"])
la.start(["--x"])
print(la.pid, flush=True)
time.sleep(600)
"""


def _wait_port(port: int) -> None:
    wait_until(lambda: pid_id.port_use(port).in_use, f"something to listen on {port}", timeout=20.0)


def test_a_console_script_server_is_adopted_after_kill_9_of_the_agent(tmp_path: Path) -> None:
    port = free_port()
    bindir = _console_script(tmp_path)
    env = {"PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    argv = ["fakevllm", "serve", str(port)]
    logs = tmp_path / "logs"
    cfg = json.dumps({"argv": argv, "logs": str(logs), "env": env, "port": port})
    agent = subprocess.Popen([sys.executable, "-c", AGENT, cfg], cwd=REPO, stdout=subprocess.PIPE, text=True)
    server_pid = int((agent.stdout.readline() if agent.stdout else "0").strip())
    try:
        _wait_port(port)
        cmd = pid_id.read_cmdline(server_pid) or []
        assert cmd[0] != "fakevllm" and cmd[1].endswith("/bin/fakevllm")  # python /abs/bin/fakevllm ...
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)

        # 1. the restarted agent adopts it through the pid file (boot id + start time)
        la = SubprocessLauncher(argv, log_dir=logs, name="srv", env=env, port=port)
        assert la.pid == server_pid and la.alive() is True and la.current_argv == ["--x"]
        assert "same boot and start time" in (la.adoption or "")
        with pytest.raises(LauncherError, match="already running"):
            la.start([])

        # 2. a pid file of an older agent (argv only) is matched through the script's interpreter
        pidfile = logs / "srv.pid.json"
        old = {k: v for k, v in json.loads(pidfile.read_text()).items() if k not in ("boot_id", "start_ticks")}
        pidfile.write_text(json.dumps(old))
        la2 = SubprocessLauncher(argv, log_dir=logs, name="srv", env=env, port=port)
        assert la2.pid == server_pid and "command line is the recorded one" in (la2.adoption or "")

        # 3. no pid file at all (an old agent deleted it): found by the port it holds
        pidfile.unlink()
        la3 = SubprocessLauncher(argv, log_dir=logs, name="srv", env=env, port=port)
        assert la3.pid == server_pid and la3.current_argv == ["--x"]
        assert f"holding port {port}" in (la3.adoption or "")
        assert pidfile.exists()  # recorded again, with its identity

        # the controller reports the adoption and starts nothing
        ctl = Controller([ManagedInstance(url=f"http://127.0.0.1:{port}", launcher=la3)], supervise_every_s=60)
        ctl.start_instances()
        events = [e.message for e in ctl.drain_events()]
        assert any("adopted pid" in m for m in events) and not any("started" in m for m in events)
        la3.stop()
        assert not pid_id.is_running(server_pid)
    finally:
        if agent.poll() is None:
            agent.kill()
        try:
            os.killpg(server_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def test_a_port_held_by_a_server_it_cannot_adopt_never_gets_a_second_one(tmp_path: Path) -> None:
    port = free_port()
    bindir = _console_script(tmp_path)
    env = {"PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    other = subprocess.Popen([sys.executable, str(FAKE), str(port)], stdout=subprocess.DEVNULL)  # not our command
    try:
        _wait_port(port)
        la = SubprocessLauncher(
            ["fakevllm", "serve", str(port)], log_dir=tmp_path / "logs", name="srv", env=env, port=port
        )
        assert la.pid is None and la.adoption is None
        ctl = Controller([ManagedInstance(url=f"http://127.0.0.1:{port}", launcher=la)], supervise_every_s=60)
        ctl.start_instances()
        for _ in range(8):  # the old agent started a second server again and again
            ctl.supervise()
        notes = [e.message for e in ctl.drain_events()]
        assert len(notes) == 1 and f"port {port} is in use by pid {other.pid}" in notes[0]
        assert "not starting a second server" in notes[0]
        assert list((tmp_path / "logs").glob("srv-*.log")) == [] and la.alive() is None
    finally:
        other.kill()
        other.wait(timeout=10)


def test_children_an_exited_server_left_are_reaped_before_the_next_start(tmp_path: Path) -> None:
    port = free_port()
    la = SubprocessLauncher([sys.executable, str(FAKE), str(port)], log_dir=tmp_path, name="srv", port=port)
    la.start(["--child"])
    try:
        _wait_port(port)
        first = la.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)  # the server dies; its child stays in the group
        la._proc.wait(timeout=10)  # type: ignore[union-attr]
        assert la.alive() is False
        from agent.launcher.subprocess import _group_alive

        assert _group_alive(first)
        la.start([])
        assert not _group_alive(first) and la.pid != first
        _wait_port(port)
    finally:
        la.stop()
