"""The whole product around one real `vllm serve`, as separate processes, as a user runs it:

    kvscope serve                      (the app, SQLite in the job folder)
    kvscope token create               (the agent's token)
    kvscope agent --launcher-config    (the agent; its `subprocess` launcher starts vllm serve)

Teardown stops the agent (which stops the server it supervises), then makes sure: any process
still serving on the test's vLLM port is stopped (SIGTERM, then SIGKILL) and the /dev/shm files
that server had open are removed. Nothing is left behind even when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.realvllm import watchdog
from tests.realvllm.server import (
    HEALTH_DEADLINE_S,
    IN_PROCESS_ENGINE,
    Install,
    _group_alive,
    _tree_shm_paths,
    die_with_parent,
    free_port,
    serve_argv,
    server_env,
)

KVSCOPE = [sys.executable, "-m", "kvscope.cli"]


def toml_str(v: str) -> str:
    return json.dumps(v)  # a JSON string is a valid TOML basic string


def toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(toml_str(i) for i in items) + "]"


def vllm_groups(port: int) -> set[int]:
    """Process groups of `vllm serve` processes listening on this test's port (by command line)."""
    groups: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"serve" in argv and b"--port" in argv and argv[argv.index(b"--port") + 1] == str(port).encode():
                groups.add(os.getpgid(int(proc.name)))
        except (OSError, ProcessLookupError, IndexError):
            continue
    return groups


@dataclass
class Stack:
    install: Install
    job: Path
    base_flags: tuple[str, ...] = ("--enforce-eager",)
    app_env: dict[str, str] = field(default_factory=dict)
    app_port: int = 0
    vllm_port: int = 0
    token: str = ""
    api_token: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    shm_seen: set[Path] = field(default_factory=set)
    shm_before: set[str] = field(default_factory=set)
    guard: subprocess.Popen[bytes] | None = None

    @property
    def app_url(self) -> str:
        return f"http://127.0.0.1:{self.app_port}"

    @property
    def vllm_url(self) -> str:
        return f"http://127.0.0.1:{self.vllm_port}"

    @property
    def data_dir(self) -> Path:
        return self.job / "data"

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.app_env}
        env.pop("KVSCOPE_CONFIG", None)
        return env

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        self.job.mkdir(parents=True, exist_ok=True)
        self.shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        self.app_port, self.vllm_port = free_port(), free_port()
        self.guard = watchdog.start([f"port:{self.vllm_port}"])
        self._spawn(
            "app",
            [
                *KVSCOPE,
                "serve",
                "--data-dir",
                str(self.data_dir),
                "--port",
                str(self.app_port),
                "--log-level",
                "warning",
            ],
        )
        self.wait(lambda: httpx.get(self.app_url + "/healthz", timeout=5).status_code == 200, "the app", 120)
        # the agent's token, bound to the host name the agent reports (this machine's), and an
        # operator API token for the test's own requests and the kvscope CLI (KVSCOPE_TOKEN)
        self.token = self._token("realvllm-agent", "--host", socket.gethostname())
        self.api_token = self._token("realvllm-api", "--role", "operator")
        config = self.job / "launcher.toml"
        command = serve_argv(self.install, self.vllm_port, self.base_flags)
        env = {
            k: v
            for k, v in server_env(self.job / "vllm", IN_PROCESS_ENGINE).items()
            if k not in os.environ or os.environ[k] != v
        }
        config.write_text(
            "stop_on_exit = true\n"
            f"state_dir = {toml_str(str(self.job / 'controller'))}\n"
            "[[instance]]\n"
            f"url = {toml_str(self.vllm_url)}\n"
            'launcher = "subprocess"\n'
            f"command = {toml_list(command)}\n"
            "initial_args = []\n"
            f"health_deadline_s = {HEALTH_DEADLINE_S}\n"
            f"model_dirs = {toml_list([str(self.install.model.parent)])}\n"
            "[instance.env]\n" + "".join(f"{k} = {toml_str(v)}\n" for k, v in sorted(env.items()))
        )
        self._spawn(
            "agent",
            [
                *KVSCOPE,
                "agent",
                "--server",
                self.app_url,
                "--token",
                self.token,
                "--vllm-url",
                self.vllm_url,
                "--launcher-config",
                str(config),
                "--no-gpu",
                "--interval",
                "1s",
                "--state-dir",
                str(self.job / "agent-state"),
                "--vllm-timeout",
                "10",
            ],
        )

    def _token(self, name: str, *flags: str) -> str:
        out = subprocess.run(
            [*KVSCOPE, "token", "create", name, *flags, "--data-dir", str(self.data_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            env=self._env(),
        )
        return out.stdout.strip().splitlines()[-1]

    def login(self, page: Any) -> None:
        """Log a Chromium page in through the login form, as a person would (a new operator)."""
        password = "realvllm-" + os.urandom(8).hex()
        subprocess.run(
            [
                *KVSCOPE,
                "user",
                "create",
                "realvllm-ui",
                "--role",
                "operator",
                "--password-stdin",
                "--data-dir",
                str(self.data_dir),
            ],
            input=password + "\n",
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            env=self._env(),
        )
        page.goto(self.app_url + "/login")
        page.fill("input[name=name]", "realvllm-ui")
        page.fill("input[name=password]", password)
        page.click("button[type=submit]")
        page.wait_for_url(self.app_url + "/")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.job / f"{name}.log").open("ab")
        try:
            self.procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env(),
                    cwd=self.job,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            )
        finally:
            log.close()
        # the watchdog learns each new group by restarting with it
        watchdog.stop(self.guard)
        self.guard = watchdog.start([f"port:{self.vllm_port}", *(f"pgid:{p.pid}" for p in self.procs)])

    # ------------------------------------------------------------------ use
    def wait(self, pred: Callable[[], Any], what: str, deadline_s: float = HEALTH_DEADLINE_S) -> Any:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(
                        f"{p.args[3] if len(p.args) > 3 else p.args} exited ({p.returncode}) "
                        f"while waiting for {what}:\n{self.logs()}"
                    )
            self.note_shm()
            with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError, IndexError):
                got = pred()
                if got:
                    return got
            time.sleep(1.0)
        raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}:\n{self.logs()}")

    def api(self, method: str, path: str, **kw: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.api_token}", **kw.pop("headers", {})}
        r = httpx.request(method, self.app_url + path, timeout=30, headers=headers, **kw)
        assert r.status_code < 400, f"{method} {path} -> {r.status_code}: {r.text[:500]}"
        return r.json()

    def instance(self) -> dict[str, Any] | None:
        for inst in self.api("GET", "/api/v1/instances")["instances"]:
            if inst["url"] == self.vllm_url:
                return dict(inst)
        return None

    def note_shm(self) -> None:
        for pgid in vllm_groups(self.vllm_port):
            self.shm_seen |= _tree_shm_paths(pgid)

    def logs(self, lines: int = 25) -> str:
        out = []
        for name in ("agent", "app"):
            with contextlib.suppress(OSError):
                text = (self.job / f"{name}.log").read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name}.log\n" + "\n".join(text))
        for log in sorted((self.job / "controller" / "logs").glob("*.log"))[-2:]:
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    # ------------------------------------------------------------------ stop
    def stop(self) -> list[str]:
        """Agent first (it stops its vLLM), then the app; then make sure nothing is left."""
        notes: list[str] = []
        self.note_shm()
        for p in reversed(self.procs):  # agent, then app
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                notes.append(f"{p.args[3]} ignored SIGTERM; killed")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        for pgid in vllm_groups(self.vllm_port):
            notes.append(f"vllm serve (group {pgid}) outlived the agent; stopped")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            end = time.monotonic() + 60
            while _group_alive(pgid) and time.monotonic() < end:
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        for path in sorted(self.shm_seen):
            if path.exists() and path.name not in self.shm_before:
                with contextlib.suppress(OSError):
                    path.unlink()
                    notes.append(f"removed {path}")
        self.procs.clear()
        watchdog.stop(self.guard)
        return notes
