"""The session cookie: a signed, HttpOnly, SameSite=Lax value naming the user and the epoch of
their password. A password change (or deleting the user) ends every older session."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass

COOKIE = "kvscope_session"
MAX_COOKIE_CHARS = 512


@dataclass(frozen=True)
class SessionClaim:
    user_id: int
    epoch: int
    issued_at: float


def _mac(secret: str, payload: str) -> str:
    return hmac.new(secret.encode(), b"session:" + payload.encode(), hashlib.sha256).hexdigest()


def encode(secret: str, claim: SessionClaim) -> str:
    raw = json.dumps({"u": claim.user_id, "e": claim.epoch, "t": round(claim.issued_at, 3)}, separators=(",", ":"))
    payload = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    return f"{payload}.{_mac(secret, payload)}"


def decode(secret: str, value: str | None, now: float, max_age_s: float) -> SessionClaim | None:
    """The claim of a valid, unexpired cookie value; None for anything else (never raises)."""
    if not value or len(value) > MAX_COOKIE_CHARS or "." not in value:
        return None
    payload, _, mac = value.rpartition(".")
    if not hmac.compare_digest(_mac(secret, payload), mac):
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        claim = SessionClaim(user_id=int(data["u"]), epoch=int(data["e"]), issued_at=float(data["t"]))
    except (ValueError, KeyError, TypeError):
        return None
    if not 0 <= now - claim.issued_at <= max_age_s:
        return None
    return claim
