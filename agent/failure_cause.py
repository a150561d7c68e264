"""Find the line that says why a server failed, in its log.

vLLM prints its root cause well above the end of the log (the API server's and engine core's
tracebacks follow it), so a plain tail misses it. The earliest Python exception line that is not a
generic wrapper ("Engine core initialization failed", "see root cause above") is the cause.
"""

from __future__ import annotations

import re

# An exception line, after vLLM's optional "(Proc pid=N) LEVEL date time [file.py:N] " prefix.
_EXC = re.compile(
    r"^(?:\([^)]*\)\s*)?"
    r"(?:(?:ERROR|WARNING|INFO|CRITICAL|DEBUG)\s+\S+\s+\S+\s+\[[^\]]*\]\s*)?"
    r"(?P<exc>(?:[A-Za-z_][\w.]*\.)?(?:[A-Z]\w*)?(?:Error|Exception|Exit)): (?P<msg>\S.*)$"
)
_WRAPPERS = (
    "engine core initialization failed",
    "see root cause above",
    "check the stack trace above",
    "please check the stack trace",
)
MAX_LEN = 400


def failure_cause(log_text: str) -> str | None:
    """The earliest specific exception line in `log_text`, or None when there is none."""
    fallback: str | None = None
    for raw in log_text.splitlines():
        m = _EXC.match(raw.strip())
        if m is None:
            continue
        line = f"{m.group('exc')}: {m.group('msg').strip()}"[:MAX_LEN]
        if any(w in line.lower() for w in _WRAPPERS):
            fallback = fallback or line
            continue
        return line
    return fallback
