"""Issue 29 (sessions): what a session cookie names, how long it lives, where it goes, who caches
what it shows. Each test is one finding of the review."""

from __future__ import annotations

import re
import time
from typing import Any

from app.auth.passwords import hash_password
from app.storage.users_store import create_user, delete_user

PASSWORD = "correct horse battery"


def _login(c: Any, name: str, password: str = PASSWORD, origin: str = "http://testserver") -> Any:
    page = c.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf
    return c.post(
        "/login",
        data={"name": name, "password": password, "csrf": csrf.group(1), "next": "/"},
        headers={"origin": origin},
        follow_redirects=False,
    )


def _session_cookie(response: Any) -> tuple[str, str]:
    """(name, full Set-Cookie header) of the session cookie a login answer sets."""
    for k, v in response.headers.multi_items():
        if k == "set-cookie" and "kvscope_session=" in v:
            return v.split("=", 1)[0], v
    raise AssertionError("no session cookie set")


def _client(app: Any, cookies: dict[str, str] | None = None, base_url: str = "http://testserver") -> Any:
    from fastapi.testclient import TestClient

    c = TestClient(app, base_url=base_url)
    for k, v in (cookies or {}).items():
        c.cookies.set(k, v)
    return c


def test_a_deleted_users_cookie_does_not_log_in_as_the_next_user(app: Any, anon: Any, engine: Any) -> None:
    viewer = create_user(engine, "bob", "viewer", hash_password(PASSWORD), time.time())
    assert _login(anon, "bob").status_code == 303
    stolen = dict(anon.cookies.items())
    assert anon.get("/api/v1/whoami").json()["name"] == "bob"
    assert delete_user(engine, "bob")
    admin = create_user(engine, "carol", "admin", hash_password(PASSWORD), time.time())
    assert admin.id == viewer.id or engine.dialect.name != "sqlite"  # SQLite hands out the id again
    with _client(app, stolen) as c:
        assert c.get("/api/v1/whoami").status_code == 401
        assert c.get("/api/v1/users").status_code == 401


def test_a_copied_cookie_is_refused_after_logout(app: Any, anon: Any, engine: Any) -> None:
    create_user(engine, "alice", "operator", hash_password(PASSWORD), time.time())
    assert _login(anon, "alice").status_code == 303
    copied = dict(anon.cookies.items())
    assert anon.post("/logout", follow_redirects=False).status_code == 303
    with _client(app, copied) as c:
        assert c.get("/api/v1/whoami").status_code == 401
        r = c.get("/", headers={"accept": "text/html"}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login")


def test_a_new_start_spends_the_login_links_of_earlier_starts(
    app: Any, anon: Any, engine: Any, tmp_path: Any, clock: Any
) -> None:
    from app.auth import local_access

    first = local_access.prepare(engine, tmp_path, clock())
    second = local_access.prepare(engine, tmp_path, clock())  # a restart prints a new link
    assert first.login_path != second.login_path
    assert anon.get(first.login_path, follow_redirects=False).status_code == 401
    assert anon.get(second.login_path, follow_redirects=False).status_code == 303
    assert anon.get("/api/v1/whoami").json()["role"] == "admin"


def test_a_secure_session_cookie_is_host_prefixed_and_bound_to_this_origin(app: Any, engine: Any) -> None:
    create_user(engine, "erin", "viewer", hash_password(PASSWORD), time.time())
    with _client(app, base_url="https://testserver") as c:
        r = _login(c, "erin", origin="https://testserver")
        assert r.status_code == 303
        name, header = _session_cookie(r)
        assert name == "__Host-kvscope_session"
        assert "Secure" in header and "Path=/" in header and "domain" not in header.lower()
        assert c.get("/api/v1/whoami").json()["name"] == "erin"
        assert c.post("/logout", follow_redirects=False).status_code == 303
        assert c.get("/api/v1/whoami").status_code == 401


def test_over_plain_http_on_a_port_the_cookie_is_named_for_that_port(app: Any, engine: Any) -> None:
    create_user(engine, "frank", "viewer", hash_password(PASSWORD), time.time())
    with _client(app, base_url="http://127.0.0.1:8080") as c:
        r = _login(c, "frank", origin="http://127.0.0.1:8080")
        assert r.status_code == 303
        name, header = _session_cookie(r)
        assert name == "p8080-kvscope_session" and "Secure" not in header
        assert c.get("/api/v1/whoami").json()["name"] == "frank"
        value = c.cookies.get(name)
    # the same cookie sent to another port of the host is not this app's session there
    with _client(app, {name: value}, base_url="http://127.0.0.1:8081") as other:
        assert other.get("/api/v1/whoami").status_code == 401


def test_answers_to_a_logged_in_user_are_never_stored_by_caches(app: Any, anon: Any, engine: Any) -> None:
    create_user(engine, "grace", "viewer", hash_password(PASSWORD), time.time())
    login_page = anon.get("/login")
    assert "no-store" not in login_page.headers.get("cache-control", "")
    assert _login(anon, "grace").status_code == 303
    for path, accept in (("/", "text/html"), ("/api/v1/whoami", "application/json"), ("/api/v1/instances", "*/*")):
        r = anon.get(path, headers={"accept": accept})
        assert r.status_code == 200, path
        assert r.headers.get("cache-control") == "no-store", path
    static = anon.get("/static/css/kvscope.css")
    assert static.status_code == 200 and "no-store" not in static.headers.get("cache-control", "")
