"""The key that signs sessions and form tokens.

Off loopback it must be set (KVSCOPE_SECRET_KEY, 32 bytes or more). On loopback a placeholder is
replaced by a random key kept in `<data dir>/secret-key` (mode 0600), so sessions survive restarts
and nobody can sign one with a well-known default.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from app.settings import PLACEHOLDER_SECRETS, Settings

MIN_SECRET_BYTES = 32
FILE_NAME = "secret-key"


def effective_secret(settings: Settings) -> str:
    key = settings.secret_key
    if key.strip().lower() not in PLACEHOLDER_SECRETS:
        return key
    return _stored_secret(Path(settings.data_dir) / FILE_NAME)


def _stored_secret(path: Path) -> str:
    try:
        text = path.read_text().strip()
        if len(text.encode()) >= MIN_SECRET_BYTES:
            return text
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(48)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key
