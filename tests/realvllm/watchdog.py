"""Stops the test's processes if the test run itself dies (a CI timeout, a SIGKILL, a crash).

    python watchdog.py PARENT_PID TARGET...     TARGET = pgid:N | port:P

Runs in its own session, polls every second whether PARENT_PID is alive; once it is not, sends
SIGTERM to every target process group (`port:P` = the groups of any `vllm serve --port P`),
waits up to 30 s, then SIGKILLs what is left, and exits. A normal teardown simply terminates the
watchdog. vLLM does not stop on its parent's death by itself (PR_SET_PDEATHSIG is not enough: a
SIGTERM during start-up leaves the engine running), hence this.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie parent counts as dead
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except (OSError, IndexError):
        return False


def _groups(targets: list[str]) -> set[int]:
    out: set[int] = set()
    for t in targets:
        kind, _, value = t.partition(":")
        if kind == "pgid":
            out.add(int(value))
        elif kind == "port":
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    argv = (proc / "cmdline").read_bytes().split(b"\0")
                    if b"serve" in argv and b"--port" in argv and argv[argv.index(b"--port") + 1] == value.encode():
                        out.add(os.getpgid(int(proc.name)))
                except (OSError, ProcessLookupError, IndexError):
                    continue
    return out


def _signal(groups: set[int], sig: int) -> set[int]:
    alive = set()
    for g in groups:
        try:
            os.killpg(g, sig)
            alive.add(g)
        except ProcessLookupError:
            pass
        except PermissionError:
            alive.add(g)
    return alive


def main(argv: list[str]) -> int:
    parent, targets = int(argv[1]), argv[2:]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while _alive(parent):
        time.sleep(1.0)
    groups = _signal(_groups(targets), signal.SIGTERM)
    end = time.monotonic() + 30
    while groups and time.monotonic() < end:
        time.sleep(0.5)
        groups = _signal(groups, 0)
    _signal(groups | _groups(targets), signal.SIGKILL)
    return 0


def start(targets: list[str]) -> subprocess.Popen[bytes]:
    """A watchdog for this process (the test run) over `targets`."""
    return subprocess.Popen(
        [sys.executable, str(HERE / "watchdog.py"), str(os.getpid()), *targets],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
