"""The session cookie: HttpOnly, SameSite=Lax, holding only a random session id. The session
itself lives in the database (app/storage/sessions_store.py), so logout, a password change or
deleting the user ends it at once, and it never names a user id that may be reused.

The cookie's name: `__Host-kvscope_session` when the cookie is Secure (the browser then takes it
only from https with Path=/ and no Domain, so no other port or subdomain can plant or shadow
it); over plain http `p<port>-kvscope_session`, so two apps on one host's ports (kvscope up and
kvscope demo, say) do not overwrite each other's login."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from app.settings import Settings

COOKIE = "kvscope_session"  # the base of the name
HOST_PREFIX = "__Host-"
MAX_COOKIE_CHARS = 128


def is_secure(settings: Settings, request: HTTPConnection) -> bool:
    """Whether this request's session cookie is (to be) Secure: cookie_secure, else https."""
    if settings.auth.cookie_secure is not None:
        return bool(settings.auth.cookie_secure)
    return request.url.scheme == "https"


def cookie_name(secure: bool, port: int | None) -> str:
    if secure:
        return HOST_PREFIX + COOKIE
    return COOKIE if port is None else f"p{port}-{COOKIE}"


def cookie_name_for(settings: Settings, request: HTTPConnection) -> str:
    return cookie_name(is_secure(settings, request), request.url.port)


def session_id_of(settings: Settings, request: HTTPConnection) -> str | None:
    """The session id the request's cookie carries; None when absent or oversized."""
    value = request.cookies.get(cookie_name_for(settings, request))
    if not value or len(value) > MAX_COOKIE_CHARS:
        return None
    return value
