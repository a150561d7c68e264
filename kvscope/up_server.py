"""The server `kvscope up -- vllm serve MODEL [ARGS...]` starts and supervises (no launcher TOML).

Everything after `--` is the server's command. It runs under the controller's subprocess launcher
(agent/launcher/subprocess.py) with this process's environment and working directory, its output
in <data dir>/logs (0600), so profiles, apply, A/B and "apply this size" work at once:

- the flags a profile can set that the user typed are the starting profile: the launcher's
  initial args and the rollback target until a rollout succeeds; the rest is the base command,
  so a rollout restarts with base + the profile's flags, never the typed ones twice
  (agent/server_command.py);
- a server that dies outside a rollout is restarted with a growing back-off (agent/controller.py
  supervise), each restart a `restart` event on the instance's page;
- stopping `up` stops the server: SIGTERM to its process group, SIGKILL after `stop_timeout_s`.

Bad input is one line (UserError): nothing after `--`, a program that is not there, a port held by
a process this launcher cannot adopt. Module level imports are standard library only.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kvscope.errors import UserError

EXAMPLE = "kvscope up -- vllm serve MODEL [ARGS...]"


@dataclass
class SupervisedServer:
    url: str  # where the agent reads it
    base_argv: list[str]  # the launcher's command
    initial_args: list[str]  # the typed profile flags: the starting profile
    controller: Any  # agent.controller.Controller
    launcher: Any  # agent.launcher.subprocess.SubprocessLauncher
    adopted: str | None  # how an already running server was adopted, else None

    def stop(self) -> None:
        """Stop supervising and stop the server (process group SIGTERM, then SIGKILL)."""
        self.controller.stop_supervising()
        self.launcher.stop()


def prepare(
    command: list[str], *, vllm_url: str | None, log_dir: Path, stop_timeout_s: float, health_deadline_s: float
) -> SupervisedServer:
    """Check the command and build its launcher and controller (nothing started yet)."""
    from agent.controller import Controller, ManagedInstance
    from agent.launcher import process_identity as pid_id
    from agent.launcher.base import LauncherError
    from agent.launcher.subprocess import SubprocessLauncher
    from agent.private_files import private_dir
    from agent.server_command import resolve_program, server_url, split_profile_flags

    if not command:
        raise UserError(f"nothing after `--`: give the server's command, e.g. `{EXAMPLE}`")
    cwd = os.getcwd()
    program, why = resolve_program(command[0], os.environ, cwd)
    if program is None:
        raise UserError(f"cannot start {command[0]!r}: {why}")
    try:
        listen = server_url(command)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    url = (vllm_url or listen).rstrip("/")
    base, initial = split_profile_flags(command)
    try:
        private_dir(log_dir)
    except OSError as exc:
        raise UserError(f"cannot create the log folder {log_dir}: {exc.strerror}; pass --data-dir") from None
    port = urlsplit(listen).port
    try:
        launcher = SubprocessLauncher(
            base,
            log_dir=log_dir,
            cwd=Path(cwd),
            name="server-" + hashlib.sha1(url.encode()).hexdigest()[:8],
            stop_timeout_s=stop_timeout_s,
            port=port,
        )
    except LauncherError as exc:
        raise UserError(str(exc)) from None
    adopted = launcher.adoption if launcher.alive() else None
    if adopted is None and port is not None:
        use = pid_id.port_use(port)
        if use.in_use:
            raise UserError(
                f"{use.describe()}, which kvscope did not start and cannot adopt: not starting a second "
                f"server on it; stop that process, or give the server another --port"
            )
    inst = ManagedInstance(
        url=url,
        launcher=launcher,
        initial_args=initial,
        start=True,
        health_deadline_s=health_deadline_s,
        restart_on_exit=True,
    )
    ctl = Controller([inst], stop_on_exit=True)
    return SupervisedServer(url, base, initial, ctl, launcher, adopted)


def start(server: SupervisedServer) -> None:
    """Start the server (unless one was adopted), then the controller's worker and supervision."""
    from agent.launcher.base import LauncherError

    if server.adopted is None:
        try:
            server.launcher.start(server.initial_args)
        except LauncherError as exc:
            raise UserError(f"cannot start {server.base_argv[0]!r}: {exc}") from None
    server.controller.start_instances()  # reports the adoption as an event
    server.controller.start_worker()
