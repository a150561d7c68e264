"""People who log in, and one-time login links. Hashing happens above this layer (app/auth);
storage keeps only the hash."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import Engine, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from app.storage.models import LoginLink, User
from app.storage.session_models import LoginSession
from kvscope.errors import UserError

USER_ROLES = ("viewer", "operator", "admin")


@dataclass(frozen=True)
class UserRow:
    id: int
    name: str
    role: str
    password_hash: str
    session_epoch: int
    created_at: float
    last_login: float | None


def _row(r: object) -> UserRow:
    m = r._mapping  # type: ignore[attr-defined]
    return UserRow(
        id=int(m["id"]),
        name=str(m["name"]),
        role=str(m["role"]),
        password_hash=str(m["password_hash"]),
        session_epoch=int(m["session_epoch"] or 0),
        created_at=float(m["created_at"]),
        last_login=m["last_login"],
    )


_COLUMNS = (User.id, User.name, User.role, User.password_hash, User.session_epoch, User.created_at, User.last_login)


def create_user(engine: Engine, name: str, role: str, password_hash: str, now: float) -> UserRow:
    if role not in USER_ROLES:
        raise UserError(f"role must be one of {', '.join(USER_ROLES)}")
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(User).values(name=name, role=role, password_hash=password_hash, session_epoch=0, created_at=now)
            )
    except IntegrityError:
        raise UserError(f"a user named {name!r} exists already") from None
    user = user_by_name(engine, name)
    assert user is not None
    return user


def user_by_name(engine: Engine, name: str) -> UserRow | None:
    with engine.connect() as conn:
        r = conn.execute(select(*_COLUMNS).where(User.name == name)).first()
    return _row(r) if r else None


def user_by_id(engine: Engine, user_id: int) -> UserRow | None:
    with engine.connect() as conn:
        r = conn.execute(select(*_COLUMNS).where(User.id == user_id)).first()
    return _row(r) if r else None


def list_users(engine: Engine) -> list[UserRow]:
    with engine.connect() as conn:
        return [_row(r) for r in conn.execute(select(*_COLUMNS).order_by(User.id)).all()]


def count_users(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(User)).scalar_one())


def delete_user(engine: Engine, name: str) -> bool:
    """Delete the user and their sessions (also by ON DELETE CASCADE, but not only: a database
    without foreign keys enforced must not keep a session row for an id SQLite may reuse)."""
    with engine.begin() as conn:
        conn.execute(delete(LoginSession).where(LoginSession.user_id.in_(select(User.id).where(User.name == name))))
        return bool(conn.execute(delete(User).where(User.name == name)).rowcount)


def set_password(engine: Engine, name: str, password_hash: str) -> bool:
    """Replace the hash and end every session of this user."""
    with engine.begin() as conn:
        res = conn.execute(
            update(User)
            .where(User.name == name)
            .values(password_hash=password_hash, session_epoch=User.session_epoch + 1)
        )
        conn.execute(delete(LoginSession).where(LoginSession.user_id.in_(select(User.id).where(User.name == name))))
    return bool(res.rowcount)


def record_login(engine: Engine, user_id: int, now: float) -> None:
    with engine.begin() as conn:
        conn.execute(update(User).where(User.id == user_id).values(last_login=now))


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_login_link(engine: Engine, user_id: int, now: float, ttl_s: float) -> str:
    """A one-time secret for /login/once; returned in clear once."""
    token = secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(
            insert(LoginLink).values(token_hash=_hash(token), user_id=user_id, created_at=now, expires_at=now + ttl_s)
        )
    return token


def expire_unused_login_links(engine: Engine, now: float) -> int:
    """Spend every unused login link (a new start prints a new one; older ones must not stay valid)."""
    with engine.begin() as conn:
        res = conn.execute(update(LoginLink).where(LoginLink.used_at.is_(None)).values(used_at=now))
    return int(res.rowcount)


def consume_login_link(engine: Engine, token: str, now: float) -> int | None:
    """The user id of a live link, which is used up by this call; None when unknown, used or expired."""
    if not token or len(token) > 256:
        return None
    with engine.begin() as conn:
        res = conn.execute(
            update(LoginLink)
            .where(LoginLink.token_hash == _hash(token), LoginLink.used_at.is_(None), LoginLink.expires_at > now)
            .values(used_at=now)
        )
        if res.rowcount != 1:
            return None
        uid = conn.execute(select(LoginLink.user_id).where(LoginLink.token_hash == _hash(token))).scalar_one()
    return int(uid)
