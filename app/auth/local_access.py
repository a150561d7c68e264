"""Home-rig convenience without a hole, for `kvscope up` and `kvscope demo`: an admin is created on
first start, each start prints a one-time login link (as Jupyter does), and an operator API token
is written to `<data dir>/api-token` (mode 0600) for the kvscope CLI on the same machine."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from app.auth.passwords import hash_password
from app.storage.tokens import create_token, list_tokens, revoke_token
from app.storage.users_store import (
    count_users,
    create_login_link,
    create_user,
    expire_unused_login_links,
    user_by_name,
)

ADMIN_NAME = "admin"
LINK_TTL_S = 24 * 3600.0
CLI_TOKEN_PREFIX = "kvscope-cli-"
API_TOKEN_FILE = "api-token"


@dataclass(frozen=True)
class LocalAccess:
    login_path: str  # /login/once?t=...; prefix it with the app's URL
    admin_created: bool
    api_token_file: Path


def prepare(engine: Engine, data_dir: Path, now: float) -> LocalAccess:
    created = False
    if count_users(engine) == 0:
        # A random password nobody knows: the one-time link logs in, `kvscope user passwd admin` sets one.
        create_user(engine, ADMIN_NAME, "admin", hash_password(secrets.token_urlsafe(24)), now)
        created = True
    admin = user_by_name(engine, ADMIN_NAME)
    login_path = "/login"
    expire_unused_login_links(engine, now)  # only the link this start prints logs in
    if admin is not None and admin.role == "admin":
        login_path = "/login/once?t=" + create_login_link(engine, admin.id, now, LINK_TTL_S)
    return LocalAccess(
        login_path=login_path, admin_created=created, api_token_file=write_cli_token(engine, data_dir, now)
    )


def write_cli_token(engine: Engine, data_dir: Path, now: float) -> Path:
    """A fresh operator token for the local CLI (earlier ones revoked), in a file only this user reads."""
    for t in list_tokens(engine):
        if str(t["name"]).startswith(CLI_TOKEN_PREFIX) and not t["revoked_at"]:
            revoke_token(engine, str(t["name"]), now)
    token = create_token(engine, f"{CLI_TOKEN_PREFIX}{int(now * 1000)}-{secrets.token_hex(3)}", now, role="operator")
    path = Path(data_dir) / API_TOKEN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return path
