"""The Launcher protocol shared by the subprocess, systemd and docker launchers."""

from __future__ import annotations

from typing import Protocol


class LauncherError(Exception):
    """A launcher could not do what was asked (the message says what and why)."""


class Launcher(Protocol):
    kind: str

    @property
    def current_argv(self) -> list[str] | None:
        """The profile flags the server was last started with (None: not started by us)."""

    def start(self, extra_argv: list[str]) -> None:
        """Start the server with the base command + extra_argv. Raises LauncherError."""

    def stop(self) -> None:
        """Stop the server (SIGTERM, wait, then kill); a no-op when it is not running."""

    def restart(self, extra_argv: list[str]) -> None:
        """stop() then start(extra_argv)."""

    def alive(self) -> bool | None:
        """True running, False exited, None unknown."""

    def exit_info(self) -> str | None:
        """Why the server is not running (e.g. 'exited with code 1'), or None."""

    def log_tail(self, max_lines: int = 40) -> str:
        """The last lines of the server's output (for a failed rollout's report)."""
