"""The systemd launcher: the unit runs vLLM; the agent rewrites its command and restarts it.

Two modes:
- `dropin` (default): writes `<dropin_dir>/<unit>.d/50-kvscope.conf` overriding ExecStart with
  the base command + the profile's flags (each argument quoted for systemd), then
  `systemctl daemon-reload` and `systemctl restart <unit>`;
- `envfile`: writes `KVSCOPE_PROFILE_ARGS=...` to an EnvironmentFile the unit reads
  (`ExecStart=/usr/bin/vllm serve ... $KVSCOPE_PROFILE_ARGS`); systemd splits that variable at
  spaces without quotes, so arguments containing whitespace are refused in this mode.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.launcher.base import LauncherError
from agent.launcher.health import HealthResult, wait_healthy
from kvcore.flag_policy import has_control

Runner = Callable[[list[str]], tuple[int, str]]
DROPIN_NAME = "50-kvscope.conf"
_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def run_command(argv: list[str]) -> tuple[int, str]:
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, str(exc)
    return cp.returncode, (cp.stdout or "") + (cp.stderr or "")


def systemd_quote(arg: str) -> str:
    """One ExecStart word: specifiers (%) and variables ($) escaped, quoted when needed."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and _SAFE.match(escaped) and escaped != ";":
        return escaped
    inner = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{inner}"'


class SystemdLauncher:
    kind = "systemd"

    def __init__(
        self,
        unit: str,
        *,
        base_argv: Sequence[str] = (),
        mode: str = "dropin",
        dropin_dir: Path = Path("/etc/systemd/system"),
        env_file: Path | None = None,
        runner: Runner = run_command,
    ) -> None:
        if not unit or "/" in unit:
            raise LauncherError("systemd launcher needs a unit name, e.g. vllm.service")
        if mode not in ("dropin", "envfile"):
            raise LauncherError("systemd mode must be 'dropin' or 'envfile'")
        if mode == "dropin" and not base_argv:
            raise LauncherError("systemd dropin mode needs the base command (command = [...])")
        if mode == "envfile" and env_file is None:
            raise LauncherError("systemd envfile mode needs env_file")
        self.unit = unit if "." in unit else unit + ".service"
        self.base_argv = list(base_argv)
        self.mode = mode
        self.dropin_dir = Path(dropin_dir)
        self.env_file = env_file
        self.runner = runner
        self._argv: list[str] | None = None

    @property
    def current_argv(self) -> list[str] | None:
        return None if self._argv is None else list(self._argv)

    @property
    def dropin_path(self) -> Path:
        return self.dropin_dir / f"{self.unit}.d" / DROPIN_NAME

    def render(self, extra_argv: list[str]) -> str:
        for a in [*self.base_argv, *extra_argv]:
            if has_control(a):  # a CR / LF would end the ExecStart= line and start another
                raise LauncherError(f"argument {a[:60]!r} has a control character (CR, LF, NUL ...): refused")
        if self.mode == "dropin":
            words = " ".join(systemd_quote(a) for a in [*self.base_argv, *extra_argv])
            return (
                f"# written by kvscope: the profile's flags for {self.unit}\n[Service]\nExecStart=\nExecStart={words}\n"
            )
        for a in extra_argv:
            if any(ch.isspace() for ch in a) or '"' in a or "\\" in a:
                raise LauncherError(f"argument {a[:60]!r} cannot go through an EnvironmentFile; use dropin mode")
        return "# written by kvscope\nKVSCOPE_PROFILE_ARGS=" + " ".join(extra_argv) + "\n"

    def _write(self, extra_argv: list[str]) -> None:
        text = self.render(extra_argv)
        path = self.dropin_path if self.mode == "dropin" else self.env_file
        assert path is not None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
        except OSError as exc:
            raise LauncherError(f"cannot write {path}: {exc.strerror or exc}") from None

    def _ctl(self, *args: str) -> str:
        code, out = self.runner(["systemctl", *args])
        if code != 0:
            raise LauncherError(f"systemctl {' '.join(args)} failed ({code}): {out.strip()[-300:]}")
        return out

    def start(self, extra_argv: list[str]) -> None:
        self._write(extra_argv)
        if self.mode == "dropin":
            self._ctl("daemon-reload")
        self._ctl("restart", self.unit)
        self._argv = list(extra_argv)

    def restart(self, extra_argv: list[str]) -> None:
        self.start(extra_argv)  # systemctl restart stops first

    def stop(self) -> None:
        self._ctl("stop", self.unit)

    def alive(self) -> bool | None:
        code, out = self.runner(["systemctl", "is-active", self.unit])
        state = out.strip().splitlines()[-1] if out.strip() else ""
        if state in ("active", "activating", "reloading"):
            return True
        if state in ("failed", "inactive", "deactivating"):
            return False
        return None if code == 127 else False

    def exit_info(self) -> str | None:
        code, out = self.runner(["systemctl", "show", self.unit, "-p", "ActiveState,Result,ExecMainStatus"])
        return out.strip().replace("\n", ", ") or None if code == 0 else None

    def log_tail(self, max_lines: int = 40) -> str:
        _code, out = self.runner(["journalctl", "-u", self.unit, "-n", str(max_lines), "--no-pager", "-o", "cat"])
        return out

    def wait_healthy(self, url: str, deadline_s: float, **kwargs: Any) -> HealthResult:
        return wait_healthy(url, deadline_s, alive=self.alive, **kwargs)
