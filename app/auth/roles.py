"""Roles, the principal a request acts as, and how a route states the role it needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from fastapi import HTTPException, Request

VIEWER = "viewer"  # sees dashboards, alerts, experiments, profiles
OPERATOR = "operator"  # applies profiles, runs A/B, acks and silences alerts, edits profiles
ADMIN = "admin"  # manages users and tokens
AGENT = "agent"  # an agent's token: pushes and command polls for its own host only
PUBLIC = "public"  # no login: /healthz, the login page, static assets

PEOPLE_ROLES = (VIEWER, OPERATOR, ADMIN)
RANK = {VIEWER: 1, OPERATOR: 2, ADMIN: 3}
ROLE_ATTR = "__kvscope_role__"

F = TypeVar("F", bound=Callable[..., Any])


def requires(role: str) -> Callable[[F], F]:
    """State the role a route needs: put it under the route decorator.

    @router.post("/api/v1/users")
    @requires(ADMIN)
    def create_user(...): ...
    """
    if role not in (*PEOPLE_ROLES, AGENT, PUBLIC):
        raise ValueError(f"unknown role {role!r}")

    def mark(func: F) -> F:
        setattr(func, ROLE_ATTR, role)
        return func

    return mark


def declared_role(endpoint: Any) -> str | None:
    """The role a route states with @requires, or None when it states none."""
    stated = getattr(endpoint, ROLE_ATTR, None)
    return stated if isinstance(stated, str) else None


def role_needed(endpoint: Any, method: str) -> str:
    """The role a route needs: its stated one. Every route of the app states one (the route sweep,
    tests/app/web/test_every_route.py, fails on one that does not); the fallback for a route that
    forgot, viewer to read and operator to change, keeps such a route closed, never open."""
    stated = declared_role(endpoint)
    if stated is not None:
        return stated
    return VIEWER if method in ("GET", "HEAD") else OPERATOR


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""

    kind: Literal["user", "token", "agent", "anonymous"]
    name: str
    role: str
    host: str | None = None  # agent tokens: the host they may speak for (None: any, the static token)
    user_id: int | None = None

    def has(self, role: str) -> bool:
        if role == PUBLIC:
            return True
        if role == AGENT:
            return self.kind == "agent"
        return self.kind != "agent" and RANK.get(self.role, 0) >= RANK.get(role, 99)

    @property
    def label(self) -> str:
        """How actions by this principal are recorded (requested_by, acked_by ...)."""
        return {"user": f"user:{self.name}", "token": f"token:{self.name}"}.get(self.kind, self.name)


ANONYMOUS = Principal(kind="anonymous", name="anonymous", role="")


def principal_of(request: Request) -> Principal:
    """The principal the auth check attached to this request."""
    p = getattr(request.state, "principal", None)
    if not isinstance(p, Principal):
        raise HTTPException(401, "not authenticated")
    return p


MAX_NOTE_CHARS = 80


def requester(request: Request, note: object) -> str:
    """Who asked, as recorded on rollouts and experiments: always the authenticated principal; a
    client's own `requested_by` is kept only as a note after it (it cannot pose as someone else)."""
    who = principal_of(request).label
    if isinstance(note, str) and note.strip():
        return f"{who} ({note.strip()[:MAX_NOTE_CHARS]})"
    return who
