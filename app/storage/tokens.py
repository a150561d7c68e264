"""Bearer tokens: created once, shown once, stored as SHA-256 (tokens are 256-bit random).

Two kinds share the table: agent tokens (role "agent"), each bound to the one host it may push
for, and API tokens for scripts (role viewer, operator or admin). Every check reads the table, so
a revoked token stops working at once.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import TypedDict

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from app.storage.models import AgentToken
from app.storage.rows import typed_row
from kvscope.errors import UserError

TOKEN_PREFIX = "kvs_"
TOKEN_ROLES = ("agent", "viewer", "operator", "admin")
MAX_TOKEN_CHARS = 512  # longer bearer values are refused before hashing


@dataclass(frozen=True)
class TokenInfo:
    name: str
    role: str
    host: str | None


class TokenRow(TypedDict):
    """A token as list_tokens shows it: never its hash. /api/v1/admin/tokens returns these."""

    name: str
    prefix: str  # first characters of the token, to tell tokens apart
    role: str  # agent | viewer | operator | admin
    host: str | None  # agent tokens: the one host it may push for
    created_at: float
    revoked_at: float | None
    last_used: float | None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(engine: Engine, name: str, now: float, *, role: str = "agent", host: str | None = None) -> str:
    """Create a token named `name` and return it in clear (the only time it is visible).

    An agent token is bound to `host` (default: its own name); other roles take no host."""
    name = name.strip()
    if not name or len(name) > 255:
        raise UserError("token name must be 1-255 characters")
    if role not in TOKEN_ROLES:
        raise UserError(f"token role must be one of {', '.join(TOKEN_ROLES)}")
    if role == "agent":
        host = (host or name).strip()
        if not host or len(host) > 255:
            raise UserError("an agent token's host must be 1-255 characters")
    elif host:
        raise UserError("--host binds agent tokens only; API tokens act for their role on every host")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(AgentToken).values(
                    name=name,
                    token_hash=hash_token(token),
                    prefix=token[:10],
                    created_at=now,
                    role=role,
                    host=host if role == "agent" else None,
                )
            )
    except IntegrityError:
        raise UserError(f"a token named {name!r} exists already; pick another name") from None
    return token


def lookup_token(engine: Engine, token: str) -> TokenInfo | None:
    """The live token this bearer value is, or None."""
    if not token or len(token) > MAX_TOKEN_CHARS:
        return None
    with engine.connect() as conn:
        row = conn.execute(
            select(AgentToken.name, AgentToken.role, AgentToken.host).where(
                AgentToken.token_hash == hash_token(token), AgentToken.revoked_at.is_(None)
            )
        ).first()
    return TokenInfo(name=row[0], role=row[1], host=row[2]) if row else None


def touch_token(engine: Engine, name: str, now: float) -> None:
    with engine.begin() as conn:
        conn.execute(update(AgentToken).where(AgentToken.name == name).values(last_used=now))


def revoke_token(engine: Engine, name: str, now: float) -> bool:
    with engine.begin() as conn:
        res = conn.execute(
            update(AgentToken).where(AgentToken.name == name, AgentToken.revoked_at.is_(None)).values(revoked_at=now)
        )
    return bool(res.rowcount)


def list_tokens(engine: Engine) -> list[TokenRow]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                AgentToken.name,
                AgentToken.prefix,
                AgentToken.role,
                AgentToken.host,
                AgentToken.created_at,
                AgentToken.revoked_at,
                AgentToken.last_used,
            ).order_by(AgentToken.id)
        ).all()
    return [typed_row(TokenRow, r._mapping) for r in rows]
