"""Files that hold what only their owner may read: kvscope's data folder, the SQLite database
(password and token hashes), the agent's spool and state, vLLM's logs. Folders are 0700, files
0600, created so from the start (never world-readable for a moment) and tightened where an older
kvscope left them looser. Standard library only: the agent and the app both use it."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import IO

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create `path` (and its parents) and make it 0700 when this user owns it."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    tighten(path, DIR_MODE)
    return path


def tighten(path: Path, mode: int = FILE_MODE) -> None:
    """Clear group and other bits of `path` where this user owns it (never widens, never raises)."""
    with contextlib.suppress(OSError):
        st = path.stat()
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
            path.chmod(stat.S_IMODE(st.st_mode) & mode)


def open_private(path: Path, mode: str = "wb") -> IO[bytes]:
    """Open `path` for binary writing ("wb" truncates, "ab" appends), created 0600."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "ab" else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    tighten(path)
    return os.fdopen(fd, mode)


def write_private_text(path: Path, text: str) -> None:
    with open_private(path) as f:
        f.write(text.encode())
