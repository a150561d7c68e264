"""The subprocess launcher: the agent starts and supervises the server process itself.

    launcher = SubprocessLauncher(["vllm", "serve", "/models/x", "--port", "8000"], log_dir=Path("logs"))
    launcher.start(["--kv-cache-dtype", "fp8"])
    launcher.wait_healthy("http://127.0.0.1:8000", deadline_s=300)
    launcher.stop()

The process runs in its own session (process group), so stop() reaches vLLM's engine children
too: SIGTERM to the group, wait, SIGKILL whatever is left. Output goes to one log file per start
in `log_dir` (the newest `keep_logs` are kept). A pid file lets a restarted agent adopt a server
it started before (and stop it later) instead of starting a second one.

Adoption compares what the process really is (agent/launcher/process_identity.py): the boot id
and the start time in /proc/<pid>/stat recorded in the pid file, or, for an older pid file or a
server holding the instance's port without one, its command line resolved against the program's
`#!` interpreter (a console script such as `vllm` runs as `python /venv/bin/vllm serve ...`).
A port held by anything it cannot adopt is reported and never gets a second server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from agent.launcher import process_identity as pid_id
from agent.launcher.base import LauncherError
from agent.launcher.health import HealthResult, wait_healthy
from agent.private_files import open_private, private_dir, write_private_text


class SubprocessLauncher:
    kind = "subprocess"

    def __init__(
        self,
        base_argv: Sequence[str],
        *,
        log_dir: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        name: str = "server",
        stop_timeout_s: float = 30.0,
        keep_logs: int = 10,
        adopt: bool = True,
        port: int | None = None,
        proc_root: Path = Path("/proc"),
    ) -> None:
        if not base_argv:
            raise LauncherError("subprocess launcher needs a command")
        self.base_argv = list(base_argv)
        self.log_dir = Path(log_dir)
        self.env = dict(env or {})
        self.cwd = cwd
        self.name = name
        self.stop_timeout_s = stop_timeout_s
        self.keep_logs = keep_logs
        self.port = port  # the port the server listens on: never start a second server there
        self.proc_root = Path(proc_root)
        self.adoption: str | None = None  # how a running server was adopted (for the agent's events)
        self._adopted_ticks: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._adopted_pid: int | None = None
        self._argv: list[str] | None = None
        self._log_path: Path | None = None
        self._log_file: IO[bytes] | None = None
        self._exit: str | None = None
        private_dir(self.log_dir)
        if adopt:
            self._adopt()

    # ------------------------------------------------------------------ protocol
    @property
    def current_argv(self) -> list[str] | None:
        return None if self._argv is None else list(self._argv)

    @property
    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        return self._adopted_pid

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def start(self, extra_argv: list[str]) -> None:
        if self.alive():
            raise LauncherError(f"{self.name} is already running (pid {self.pid}); stop it first")
        if self.pid is not None and _group_alive(self.pid):  # what an exited server left (its engine
            self._reap_group(self.pid)  # core may still hold the port): gone before the next start
        if self.port is not None:
            use = pid_id.port_use(self.port, self.proc_root)
            if use.in_use:
                raise LauncherError(
                    f"{use.describe(self.proc_root)}, which this agent did not start and cannot adopt: "
                    "not starting a second server on it"
                )
        argv = [*self.base_argv, *extra_argv]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        n = 0
        while True:
            path = self.log_dir / f"{self.name}-{stamp}-{n}.log"
            if not path.exists():
                break
            n += 1
        log = open_private(path, "ab")
        log.write(f"# kvscope: starting {json.dumps(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            log.close()
            raise LauncherError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        self._close_log()
        self._proc, self._adopted_pid = proc, None
        self._argv = list(extra_argv)
        self._log_path, self._log_file = path, log
        self._exit = None
        self._write_pidfile(proc.pid, extra_argv)
        self._prune_logs()

    def stop(self) -> None:
        pid = self.pid
        if pid is None:
            return
        if self._proc is not None:
            self._stop_child(self._proc)
        else:
            self._stop_adopted(pid)
        self._proc, self._adopted_pid, self._adopted_ticks = None, None, None
        self._close_log()
        self._remove_pidfile()

    def restart(self, extra_argv: list[str]) -> None:
        self.stop()
        self.start(extra_argv)

    def alive(self) -> bool | None:
        if self._proc is not None:
            code = self._proc.poll()
            if code is None:
                return True
            self._exit = _describe_exit(code)
            return False
        if self._adopted_pid is not None:
            st = pid_id.read_stat(self._adopted_pid, self.proc_root)
            same = st is not None and (self._adopted_ticks is None or st.start_ticks == self._adopted_ticks)
            if same and pid_id.is_running(self._adopted_pid, self.proc_root):
                return True
            self._exit = "exited (adopted process, exit code unknown)"
            return False
        return None if self._exit is None else False

    def exit_info(self) -> str | None:
        self.alive()
        return self._exit

    def log_tail(self, max_lines: int = 40) -> str:
        if self._log_path is None:
            return ""
        try:
            with self._log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 64 * 1024))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-max_lines:])

    def wait_healthy(self, url: str, deadline_s: float, **kwargs: Any) -> HealthResult:
        return wait_healthy(url, deadline_s, alive=self.alive, **kwargs)

    # ------------------------------------------------------------------ internals
    def _stop_child(self, proc: subprocess.Popen[bytes]) -> None:
        pgid = proc.pid  # its own session: pgid == pid
        if proc.poll() is None:
            _killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                _killpg(pgid, signal.SIGKILL)
                proc.wait(timeout=10)
        self._exit = _describe_exit(proc.returncode) + " (stopped by kvscope)"
        self._reap_group(pgid)

    def _stop_adopted(self, pid: int) -> None:
        _killpg(pid, signal.SIGTERM)
        t_end = time.monotonic() + self.stop_timeout_s
        while _pid_alive(pid) and time.monotonic() < t_end:
            time.sleep(0.1)
        if _pid_alive(pid):
            _killpg(pid, signal.SIGKILL)
        self._exit = "stopped by kvscope (adopted process)"
        self._reap_group(pid)

    def _reap_group(self, pgid: int) -> None:
        """Children left in the group after the main process exited: TERM, short grace, KILL."""
        if not _group_alive(pgid):
            return
        _killpg(pgid, signal.SIGTERM)
        t_end = time.monotonic() + 5.0
        while _group_alive(pgid) and time.monotonic() < t_end:
            time.sleep(0.05)
        _killpg(pgid, signal.SIGKILL)

    def _prune_logs(self) -> None:
        logs = sorted(self.log_dir.glob(f"{self.name}-*.log"), key=lambda p: p.stat().st_mtime)
        for old in logs[: max(0, len(logs) - self.keep_logs)]:
            if old != self._log_path:
                try:
                    old.unlink()
                except OSError:
                    pass

    def _close_log(self) -> None:
        if self._log_file is not None:
            try:
                self._log_file.close()
            except OSError:
                pass
            self._log_file = None

    @property
    def _pidfile(self) -> Path:
        return self.log_dir / f"{self.name}.pid.json"

    def _write_pidfile(self, pid: int, extra_argv: list[str]) -> None:
        data = {
            "pid": pid,
            "argv": [*self.base_argv, *extra_argv],
            "extra_argv": extra_argv,
            "log": str(self._log_path) if self._log_path else None,
            **pid_id.identity(pid, self.proc_root),  # boot_id, start_ticks: what the process is
        }
        try:
            write_private_text(self._pidfile, json.dumps(data))
        except OSError:
            pass

    def _remove_pidfile(self) -> None:
        try:
            self._pidfile.unlink()
        except OSError:
            pass

    def _adopt(self) -> None:
        """Adopt the server a previous agent started: by its pid file, else by the port it holds."""
        try:
            data = json.loads(self._pidfile.read_text())
            pid = int(data["pid"])
            argv = [str(a) for a in data["argv"]]
        except (OSError, ValueError, KeyError, TypeError):
            data, pid, argv = None, 0, []
        if data is not None:
            why = self._same_process(pid, argv, data)
            if why is not None:
                log = data.get("log")
                extra = [str(a) for a in data.get("extra_argv") or []]
                self._take(pid, extra, Path(log) if log else None, why)
                return
            self._remove_pidfile()  # gone, or its pid now belongs to another process
        if self.port is not None:
            self._adopt_by_port(self.port)

    def _same_process(self, pid: int, argv: list[str], data: dict[str, Any]) -> str | None:
        """How the pid file's process is known to be still the same one (None: it is not)."""
        st = pid_id.read_stat(pid, self.proc_root)
        if st is None or not pid_id.is_running(pid, self.proc_root):
            return None
        ticks, boot = data.get("start_ticks"), data.get("boot_id")
        if isinstance(ticks, int) and boot:
            if boot == pid_id.boot_id(self.proc_root) and ticks == st.start_ticks:
                return f"pid {pid} from the pid file (same boot and start time)"
            return None
        cmd = pid_id.read_cmdline(pid, self.proc_root) or []
        if pid_id.same_command(cmd, argv, path_env=self._path_env()):
            return f"pid {pid} from the pid file (its command line is the recorded one)"
        return None

    def _adopt_by_port(self, port: int) -> None:
        use = pid_id.port_use(port, self.proc_root)
        for leader in use.leaders:
            cmd = pid_id.read_cmdline(leader, self.proc_root) or []
            end = pid_id.match_command(cmd, self.base_argv, path_env=self._path_env())
            if end is not None:
                self._take(leader, cmd[end:], None, f"pid {leader} holding port {port} (runs this instance's command)")
                return

    def _take(self, pid: int, extra_argv: list[str], log: Path | None, how: str) -> None:
        st = pid_id.read_stat(pid, self.proc_root)
        self._adopted_pid, self._adopted_ticks = pid, st.start_ticks if st else None
        self._argv = list(extra_argv)
        self._log_path = log
        self.adoption = f"adopted {how}"
        self._write_pidfile(pid, self._argv)

    def _path_env(self) -> str | None:
        return self.env.get("PATH") or os.environ.get("PATH")


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Any live (non-zombie) process left in the group."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie is not alive
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
