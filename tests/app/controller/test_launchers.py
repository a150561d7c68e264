"""Launchers: a real subprocess (started, logged, stopped with its children), systemd with a
recorded runner, docker against a fake Engine API."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.launcher.base import LauncherError
from agent.launcher.docker import DockerLauncher, demux_logs
from agent.launcher.health import wait_healthy
from agent.launcher.subprocess import SubprocessLauncher
from agent.launcher.systemd import SystemdLauncher, systemd_quote
from tests.ports import free_port

FAKE = Path(__file__).parent / "fake_server.py"


@pytest.fixture
def launcher(tmp_path: Path) -> Any:
    port = free_port()
    la = SubprocessLauncher(
        [sys.executable, str(FAKE), str(port)], log_dir=tmp_path / "logs", name="fake", stop_timeout_s=1
    )
    la.port = port  # type: ignore[attr-defined]
    try:
        yield la
    finally:
        la.stop()


def test_subprocess_start_health_restart_stop(launcher: Any) -> None:
    url = f"http://127.0.0.1:{launcher.port}"
    launcher.start(["--kv-cache-dtype", "fp8"])
    assert launcher.alive() is True
    res = launcher.wait_healthy(url, 20)
    assert res.ok and res.model == "fake" and res.model_root == "/srv/models/fake"
    first_log = launcher.log_path
    launcher.restart(["--kv-cache-dtype", "auto"])
    assert launcher.wait_healthy(url, 20).ok
    assert launcher.current_argv == ["--kv-cache-dtype", "auto"]
    assert launcher.log_path != first_log
    assert '["--kv-cache-dtype", "fp8"]' in first_log.read_text()
    pid = launcher.pid
    launcher.stop()
    assert launcher.alive() is False and "stopped by kvscope" in (launcher.exit_info() or "")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_subprocess_exit_is_seen_by_the_health_wait(launcher: Any) -> None:
    launcher.start(["--exit-code", "3"])
    res = launcher.wait_healthy(f"http://127.0.0.1:{launcher.port}", 20)
    assert not res.ok and "exited" in res.reason
    assert launcher.exit_info() == "exited with code 3"
    assert '"--exit-code", "3"' in launcher.log_tail()


def test_subprocess_stop_kills_stubborn_process_and_its_children(launcher: Any) -> None:
    launcher.start(["--ignore-term", "--child"])
    assert launcher.wait_healthy(f"http://127.0.0.1:{launcher.port}", 20).ok
    pgid = launcher.pid
    launcher.stop()  # SIGTERM ignored -> SIGKILL after stop_timeout_s; the child goes too
    from agent.launcher.subprocess import _group_alive

    assert not _group_alive(pgid)  # nothing left but zombies waiting for init


def test_subprocess_adoption_after_agent_restart(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, str(FAKE), str(port)]
    first = SubprocessLauncher(argv, log_dir=tmp_path, name="fake", stop_timeout_s=3)
    first.start(["--x"])
    try:
        assert first.wait_healthy(f"http://127.0.0.1:{port}", 20).ok
        second = SubprocessLauncher(argv, log_dir=tmp_path, name="fake", stop_timeout_s=3)
        assert second.alive() is True and second.pid == first.pid and second.current_argv == ["--x"]
        with pytest.raises(LauncherError, match="already running"):
            second.start([])
        second.stop()
        assert second.alive() is False
    finally:
        first.stop()


def test_start_of_missing_program(tmp_path: Path) -> None:
    la = SubprocessLauncher(["/nonexistent/vllm"], log_dir=tmp_path)
    with pytest.raises(LauncherError, match="cannot start"):
        la.start([])


def test_wait_healthy_deadline_with_a_fake_clock() -> None:
    t = [0.0]

    def sleep(dt: float) -> None:
        t[0] += dt

    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    res = wait_healthy("http://x", 5.0, client=client, clock=lambda: t[0], sleep=sleep, poll_s=1.0)
    assert not res.ok and "503" in res.reason and res.elapsed_s >= 5.0


# ---------------------------------------------------------------- systemd
def test_systemd_dropin_and_commands(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def runner(argv: list[str]) -> tuple[int, str]:
        calls.append(argv)
        return (0, "active\n") if argv[1] == "is-active" else (0, "")

    la = SystemdLauncher("vllm", base_argv=["/opt/vllm/bin/vllm", "serve", "/m"], dropin_dir=tmp_path, runner=runner)
    cfg = '{"kv_connector":"OffloadingConnector","root_dir":"/mnt/my kv"}'
    la.start(["--kv-transfer-config", cfg, "--max-model-len", "4096"])
    text = (tmp_path / "vllm.service.d" / "50-kvscope.conf").read_text()
    assert "ExecStart=\nExecStart=/opt/vllm/bin/vllm serve /m --kv-transfer-config " in text
    assert '"{\\"kv_connector\\":\\"OffloadingConnector\\",\\"root_dir\\":\\"/mnt/my kv\\"}"' in text
    assert calls == [["systemctl", "daemon-reload"], ["systemctl", "restart", "vllm.service"]]
    assert la.alive() is True
    assert systemd_quote("50%$HOME") == '"50%%$$HOME"' and systemd_quote("/a/b") == "/a/b"


def test_systemd_envfile_refuses_spaces_and_reports_failures(tmp_path: Path) -> None:
    la = SystemdLauncher(
        "vllm.service", mode="envfile", env_file=tmp_path / "vllm.env", runner=lambda a: (1, "Job failed")
    )
    with pytest.raises(LauncherError, match="EnvironmentFile"):
        la.start(["--x", "a b"])
    with pytest.raises(LauncherError, match="Job failed"):
        la.start(["--kv-cache-dtype", "fp8"])
    assert (tmp_path / "vllm.env").read_text().endswith("KVSCOPE_PROFILE_ARGS=--kv-cache-dtype fp8\n")


# ---------------------------------------------------------------- docker
class FakeDocker:
    def __init__(self, start_fails: bool = False) -> None:
        self.containers: dict[str, dict[str, Any]] = {
            "vllm": {
                "Id": "old",
                "Name": "/vllm",
                "Config": {"Image": "vllm/vllm-openai", "Env": ["A=1"], "Cmd": ["--model", "m"]},
                "HostConfig": {"Runtime": "nvidia"},
                "State": {"Running": True},
                "NetworkSettings": {"Networks": {"bridge": {"Aliases": None, "IPAddress": "1.2.3.4"}}},
            },
        }
        self.log: list[str] = []
        self.start_fails = start_fails

    def _find(self, key: str) -> tuple[str, dict[str, Any]] | None:
        for name, c in self.containers.items():
            if key in (name, c["Id"]):
                return name, c
        return None

    def __call__(self, req: httpx.Request) -> httpx.Response:
        path = req.url.path.removeprefix("/v1.43")
        self.log.append(f"{req.method} {path}")
        parts = path.strip("/").split("/")
        if req.method == "POST" and path == "/containers/create":
            body = json.loads(req.content)
            name = req.url.params["name"]
            self.containers[name] = {
                "Id": "new",
                "Config": body,
                "HostConfig": body["HostConfig"],
                "State": {"Running": False},
            }
            return httpx.Response(201, json={"Id": "new"})
        found = self._find(parts[1]) if len(parts) > 1 else None
        if found is None:
            return httpx.Response(404, json={"message": "no such container"})
        name, c = found
        action = parts[2] if len(parts) > 2 else ""
        if req.method == "GET" and action == "json":
            return httpx.Response(200, json=c)
        if action == "stop":
            c["State"]["Running"] = False
            return httpx.Response(204)
        if action == "rename":
            self.containers[req.url.params["name"]] = self.containers.pop(name)
            return httpx.Response(204)
        if action == "start":
            if self.start_fails and c["Id"] == "new":
                return httpx.Response(500, json={"message": "could not select device driver"})
            c["State"]["Running"] = True
            return httpx.Response(204)
        if req.method == "DELETE":
            del self.containers[name]
            return httpx.Response(204)
        if action == "logs":
            return httpx.Response(200, content=b"\x01\x00\x00\x00\x00\x00\x00\x05hello")
        return httpx.Response(400)


def test_docker_recreates_with_new_args() -> None:
    fake = FakeDocker()
    la = DockerLauncher("vllm", base_cmd=["--model", "m"], transport=httpx.MockTransport(fake))
    la.start(["--kv-cache-dtype", "fp8"])
    assert set(fake.containers) == {"vllm"}
    new = fake.containers["vllm"]
    assert new["Id"] == "new" and new["State"]["Running"]
    assert new["Config"]["Cmd"] == ["--model", "m", "--kv-cache-dtype", "fp8"]
    assert new["Config"]["Image"] == "vllm/vllm-openai" and new["HostConfig"] == {"Runtime": "nvidia"}
    assert la.alive() is True and la.current_argv == ["--kv-cache-dtype", "fp8"]
    assert la.log_tail() == "hello"


def test_docker_puts_the_old_container_back_when_the_new_one_fails() -> None:
    fake = FakeDocker(start_fails=True)
    la = DockerLauncher("vllm", base_cmd=["--model", "m"], transport=httpx.MockTransport(fake))
    with pytest.raises(LauncherError, match="old one restored"):
        la.start(["--kv-cache-dtype", "fp8"])
    assert set(fake.containers) == {"vllm"}
    assert fake.containers["vllm"]["Id"] == "old" and fake.containers["vllm"]["State"]["Running"]


def test_docker_missing_template() -> None:
    la = DockerLauncher("nope", base_cmd=[], transport=httpx.MockTransport(FakeDocker()))
    with pytest.raises(LauncherError, match="not found"):
        la.start([])
    assert la.alive() is False
    assert demux_logs(b"plain text") == "plain text"
