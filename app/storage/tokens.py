"""Agent tokens: created once, shown once, stored as SHA-256 (tokens are 256-bit random)."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from app.storage.models import AgentToken
from kvscope.errors import UserError

TOKEN_PREFIX = "kvs_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(engine: Engine, name: str, now: float) -> str:
    """Create a token named `name` and return it in clear (the only time it is visible)."""
    name = name.strip()
    if not name or len(name) > 255:
        raise UserError("token name must be 1-255 characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(AgentToken).values(name=name, token_hash=hash_token(token), prefix=token[:10], created_at=now)
            )
    except IntegrityError:
        raise UserError(f"a token named {name!r} exists already; pick another name") from None
    return token


def lookup_token(engine: Engine, token: str) -> str | None:
    """The name of a live token, or None."""
    with engine.connect() as conn:
        row = conn.execute(
            select(AgentToken.name).where(AgentToken.token_hash == hash_token(token), AgentToken.revoked_at.is_(None))
        ).first()
    return row[0] if row else None


def touch_token(engine: Engine, name: str, now: float) -> None:
    with engine.begin() as conn:
        conn.execute(update(AgentToken).where(AgentToken.name == name).values(last_used=now))


def revoke_token(engine: Engine, name: str, now: float) -> bool:
    with engine.begin() as conn:
        res = conn.execute(
            update(AgentToken).where(AgentToken.name == name, AgentToken.revoked_at.is_(None)).values(revoked_at=now)
        )
    return bool(res.rowcount)


def list_tokens(engine: Engine) -> list[dict[str, object]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                AgentToken.name,
                AgentToken.prefix,
                AgentToken.created_at,
                AgentToken.revoked_at,
                AgentToken.last_used,
            ).order_by(AgentToken.id)
        ).all()
    return [dict(r._mapping) for r in rows]
