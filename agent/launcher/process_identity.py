"""What a process really is, read from /proc: for adopting a server after the agent restarted,
and for refusing to start a second server on a port that is taken.

A pid alone is not an identity (pids are reused) and argv strings are not either: a console
script such as `vllm` runs as `/venv/bin/python3 /venv/bin/vllm serve ...`, so /proc/<pid>/cmdline
never equals the argv the agent passed. What identifies the process the agent started:
- (boot id, pid, start time): the start time of /proc/<pid>/stat (field 22, clock ticks since
  boot) is recorded in the pid file right after the start, and no other process of this boot can
  have both;
- for a pid file without a start time (older agents), or a server found only by its port: the
  command line compared with the argv resolved the way the kernel ran it (the program looked up
  in PATH, a script's `#!` interpreter in front);
- the port: the processes holding a listening socket on it (/proc/net/tcp{,6} inode ->
  /proc/<pid>/fd/* -> socket:[inode]), and the session their leader started.

Every reader takes `proc_root` (tests use recorded trees) and tolerates missing files.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    pgrp: int
    session: int
    start_ticks: int


def read_stat(pid: int, proc_root: Path = Path("/proc")) -> ProcStat | None:
    try:
        text = (proc_root / str(pid) / "stat").read_text(errors="replace")
        fields = text.rsplit(")", 1)[1].split()
        return ProcStat(pid, fields[0], int(fields[2]), int(fields[3]), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def read_cmdline(pid: int, proc_root: Path = Path("/proc")) -> list[str] | None:
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p] or None


def boot_id(proc_root: Path = Path("/proc")) -> str | None:
    try:
        return (proc_root / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


def is_running(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """A live process (not a zombie, not dead) by its /proc entry."""
    st = read_stat(pid, proc_root)
    return st is not None and st.state not in ("Z", "X", "x")


def identity(pid: int, proc_root: Path = Path("/proc")) -> dict[str, Any]:
    """What the pid file records right after a start: the facts that identify this process."""
    st = read_stat(pid, proc_root)
    return {"boot_id": boot_id(proc_root), "start_ticks": st.start_ticks if st else None}


# ---------------------------------------------------------------- commands
def _real(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def resolve_program(program: str, path_env: str | None) -> str | None:
    """The file the kernel runs for argv[0] (PATH lookup for a bare name), symlinks resolved."""
    found = program if os.sep in program else shutil.which(program, path=path_env)
    return _real(found) if found else None


def shebang_interpreter(script: str) -> str | None:
    """The interpreter of a `#!` script (`#!/usr/bin/env python3` resolved through PATH)."""
    try:
        with open(script, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode(errors="replace").split()
    if not parts:
        return None
    if os.path.basename(parts[0]) == "env" and len(parts) > 1:
        return resolve_program(parts[1], os.environ.get("PATH"))
    return _real(parts[0])


def match_command(
    cmdline: Sequence[str],
    argv: Sequence[str],
    *,
    path_env: str | None = None,
    resolve: Callable[[str, str | None], str | None] = resolve_program,
    interpreter: Callable[[str], str | None] = shebang_interpreter,
) -> int | None:
    """Where `argv` ends in a process's cmdline when the cmdline starts with what running `argv`
    gives (None: it does not): `argv` itself, `argv[0]` resolved through PATH, or `<the script's
    #! interpreter> [interpreter options] <script> argv[1:]` (a console script such as `vllm`)."""
    if not cmdline or not argv:
        return None
    rest = list(argv[1:])

    def after(i: int) -> int | None:  # cmdline[i] is the program: argv[1:] must follow it
        return i + 1 + len(rest) if list(cmdline[i + 1 : i + 1 + len(rest)]) == rest else None

    if cmdline[0] == argv[0]:
        return after(0)
    program = resolve(argv[0], path_env)
    if program is None:
        return None
    if _real(cmdline[0]) == program:
        return after(0)
    interp = interpreter(program)
    if interp is None or _real(cmdline[0]) != interp:
        return None
    for i in range(1, min(4, len(cmdline))):  # python [-u] [-X opt] script ...
        if _real(cmdline[i]) == program:
            return after(i) if all(a.startswith("-") for a in cmdline[1:i]) else None
    return None


def same_command(cmdline: Sequence[str], argv: Sequence[str], **kw: Any) -> bool:
    """Whether a process's whole cmdline is what running `argv` gives (see match_command)."""
    end = match_command(cmdline, argv, **kw)
    return end is not None and end == len(cmdline)


# ---------------------------------------------------------------- ports
def listening_inodes(port: int, proc_root: Path = Path("/proc")) -> set[str]:
    """Socket inodes listening on TCP `port` (any address, IPv4 and IPv6)."""
    out: set[str] = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / name).read_text(errors="replace").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != LISTEN:
                continue
            try:
                if int(cols[1].rsplit(":", 1)[1], 16) == port:
                    out.add(cols[9])
            except (IndexError, ValueError):
                continue
    return out


def socket_owners(inodes: set[str], proc_root: Path = Path("/proc")) -> list[int]:
    """The pids with one of these socket inodes open (those we may read: ours, or all as root)."""
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    owners: list[int] = []
    try:
        entries = [e for e in os.listdir(proc_root) if e.isdigit()]
    except OSError:
        return owners
    for entry in sorted(entries, key=int):
        fd_dir = proc_root / entry / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) in wanted:
                    owners.append(int(entry))
                    break
            except OSError:
                continue
    return owners


@dataclass(frozen=True)
class PortUse:
    port: int
    in_use: bool
    owners: list[int]  # pids holding the listening socket (may be empty: another user's process)
    leaders: list[int]  # the session leaders of those processes

    def describe(self, proc_root: Path = Path("/proc")) -> str:
        if not self.owners:
            return f"port {self.port} is in use by a process the agent cannot see"
        pid = self.owners[0]
        cmd = " ".join(read_cmdline(pid, proc_root) or ["?"])[:200]
        return f"port {self.port} is in use by pid {pid} ({cmd})"


def port_use(port: int, proc_root: Path = Path("/proc")) -> PortUse:
    inodes = listening_inodes(port, proc_root)
    owners = socket_owners(inodes, proc_root)
    leaders: list[int] = []
    for pid in owners:
        st = read_stat(pid, proc_root)
        lead = st.session if st and st.session > 0 else pid
        if lead not in leaders:
            leaders.append(lead)
    return PortUse(port, bool(inodes), owners, leaders)
