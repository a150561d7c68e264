"""The key that signs sessions and form tokens.

Off loopback it must be set (KVSCOPE_SECRET_KEY, 32 bytes or more). On loopback a placeholder is
replaced by a random key kept in `<data dir>/secret-key` (mode 0600), so sessions survive restarts
and nobody can sign one with a well-known default.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from app.settings import PLACEHOLDER_SECRETS, Settings

MIN_SECRET_BYTES = 32
FILE_NAME = "secret-key"


def effective_secret(settings: Settings) -> str:
    key = settings.auth.secret_key
    if key.strip().lower() not in PLACEHOLDER_SECRETS:
        return key
    return _stored_secret(Path(settings.server.data_dir) / FILE_NAME)


def _stored_secret(path: Path) -> str:
    """The key in `path`, made once: the first process to create the file writes it (O_EXCL), any
    other reads that one, so two processes starting together share one key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # the creator may not have written it yet
            text = path.read_text().strip()
            if len(text.encode()) >= MIN_SECRET_BYTES:
                return text
            time.sleep(0.02)
        raise RuntimeError(f"{path} holds no usable secret key: delete it (sessions then start over)") from None
    key = secrets.token_urlsafe(48)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key
