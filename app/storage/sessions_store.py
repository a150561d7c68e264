"""Login sessions: created at login, looked up on every request, revoked at logout, password
change and user deletion. The id is returned in clear once (for the cookie); only its hash is kept."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import Engine, delete, insert, select, update

from app.storage.session_models import LoginSession

MAX_SESSION_ID_CHARS = 128


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()


def create_session(engine: Engine, user_id: int, now: float, ttl_s: float) -> str:
    """A new session for this user; the random id goes in the cookie. Drops long-dead rows."""
    session_id = secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(delete(LoginSession).where(LoginSession.expires_at < now - 86400.0))
        conn.execute(
            insert(LoginSession).values(
                token_hash=_hash(session_id), user_id=user_id, created_at=now, expires_at=now + ttl_s
            )
        )
    return session_id


def session_user_id(engine: Engine, session_id: str | None, now: float) -> int | None:
    """The user of a live session (not revoked, not expired); None for anything else."""
    if not session_id or len(session_id) > MAX_SESSION_ID_CHARS:
        return None
    with engine.connect() as conn:
        uid = conn.execute(
            select(LoginSession.user_id).where(
                LoginSession.token_hash == _hash(session_id),
                LoginSession.revoked_at.is_(None),
                LoginSession.expires_at > now,
            )
        ).scalar_one_or_none()
    return int(uid) if uid is not None else None


def revoke_session(engine: Engine, session_id: str | None, now: float) -> bool:
    if not session_id or len(session_id) > MAX_SESSION_ID_CHARS:
        return False
    with engine.begin() as conn:
        res = conn.execute(
            update(LoginSession)
            .where(LoginSession.token_hash == _hash(session_id), LoginSession.revoked_at.is_(None))
            .values(revoked_at=now)
        )
    return bool(res.rowcount)


def revoke_user_sessions(engine: Engine, user_id: int, now: float) -> int:
    """End every session of one user (password change, deletion)."""
    with engine.begin() as conn:
        res = conn.execute(
            update(LoginSession)
            .where(LoginSession.user_id == user_id, LoginSession.revoked_at.is_(None))
            .values(revoked_at=now)
        )
    return int(res.rowcount)
