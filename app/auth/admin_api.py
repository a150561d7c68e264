"""The auth part's JSON API: who am I (any login or token), users and tokens (admins only)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from app.auth.passwords import MAX_PASSWORD_CHARS, hash_password
from app.auth.roles import ADMIN, VIEWER, principal_of, requires
from app.storage.tokens import create_token, list_tokens, revoke_token
from app.storage.users_store import create_user, delete_user, list_users, set_password
from app.web.deps import CtxDep
from kvscope.errors import UserError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"


class NewUser(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=NAME_PATTERN)
    role: Literal["viewer", "operator", "admin"]
    password: str = Field(..., min_length=1, max_length=MAX_PASSWORD_CHARS)


class NewPassword(BaseModel):
    model_config = ConfigDict(extra="forbid")
    password: str = Field(..., min_length=1, max_length=MAX_PASSWORD_CHARS)


class NewToken(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=NAME_PATTERN)
    role: Literal["agent", "viewer", "operator", "admin"] = "agent"
    host: str | None = Field(None, min_length=1, max_length=255)


def user_error(exc: UserError) -> HTTPException:
    return HTTPException(422, str(exc))


router = APIRouter()


@router.get("/api/v1/whoami")
@requires(VIEWER)
def whoami(request: Request) -> dict[str, Any]:
    """Viewer: who this session or token is."""
    who = principal_of(request)
    return {"kind": who.kind, "name": who.name, "role": who.role}


@router.get("/api/v1/users")
@requires(ADMIN)
def users(ctx: CtxDep) -> dict[str, Any]:
    """Admin: every user (never a hash)."""
    return {
        "users": [
            {"name": u.name, "role": u.role, "created_at": u.created_at, "last_login": u.last_login}
            for u in list_users(ctx.engine)
        ]
    }


@router.post("/api/v1/users", status_code=201)
@requires(ADMIN)
def add_user(ctx: CtxDep, body: NewUser) -> dict[str, Any]:
    """Admin: create a user."""
    try:
        u = create_user(ctx.engine, body.name, body.role, hash_password(body.password), ctx.now())
    except UserError as exc:
        raise user_error(exc) from None
    return {"name": u.name, "role": u.role}


@router.put("/api/v1/users/{name}/password")
@requires(ADMIN)
def change_password(ctx: CtxDep, name: str, body: NewPassword) -> dict[str, Any]:
    """Admin: set a user's password (ends their sessions)."""
    try:
        changed = set_password(ctx.engine, name[:64], hash_password(body.password))
    except UserError as exc:
        raise user_error(exc) from None
    if not changed:
        raise HTTPException(404, f"no user named {name[:64]!r}")
    return {"name": name, "changed": True}


@router.delete("/api/v1/users/{name}")
@requires(ADMIN)
def remove_user(ctx: CtxDep, name: str) -> dict[str, Any]:
    """Admin: delete a user (ends their sessions)."""
    if not delete_user(ctx.engine, name[:64]):
        raise HTTPException(404, f"no user named {name[:64]!r}")
    return {"name": name, "deleted": True}


@router.get("/api/v1/tokens")
@requires(ADMIN)
def tokens(ctx: CtxDep) -> dict[str, Any]:
    """Admin: every token by name, role, bound host and prefix (never the token)."""
    return {"tokens": list_tokens(ctx.engine)}


@router.post("/api/v1/tokens", status_code=201)
@requires(ADMIN)
def add_token(ctx: CtxDep, body: NewToken) -> dict[str, Any]:
    """Admin: create a token; the answer is the only time it is shown."""
    try:
        token = create_token(ctx.engine, body.name, ctx.now(), role=body.role, host=body.host)
    except UserError as exc:
        raise user_error(exc) from None
    return {"name": body.name, "role": body.role, "token": token}


@router.delete("/api/v1/tokens/{name}")
@requires(ADMIN)
def remove_token(ctx: CtxDep, name: str) -> dict[str, Any]:
    """Admin: revoke a token (effective at once)."""
    if not revoke_token(ctx.engine, name[:255], ctx.now()):
        raise HTTPException(404, f"no active token named {name[:255]!r}")
    return {"name": name, "revoked": True}
