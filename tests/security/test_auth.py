"""Issue 14: logins, roles, tokens. Each test is one finding of the attack on the unlocked app."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from app.auth.passwords import hash_password
from app.auth.roles import ADMIN, AGENT, PUBLIC, VIEWER
from app.auth.route_table import role_table
from app.storage.tokens import create_token, revoke_token
from app.storage.users_store import create_user, set_password
from tests.conftest import make_batch

PUBLIC_PATHS = {"/healthz", "/login", "/login/once", "/static/{path}"}


def _routes(app: Any) -> list[tuple[str, str, str]]:
    """(method, path with ids filled in, role) of every route, read from the app (role_table)."""
    out = [(m, re.sub(r"\{[^}]+\}", "1", p), role) for m, p, role in role_table(app)]
    assert len(out) > 40, "the route table looks empty"
    return out


def test_every_route_refuses_an_anonymous_caller_except_the_public_ones(app: Any, anon: Any) -> None:
    for method, template, need in role_table(app):
        path = re.sub(r"\{[^}]+\}", "1", template)
        r = anon.request(method, path, headers={"accept": "application/json"}, follow_redirects=False)
        if need == PUBLIC:
            assert template in PUBLIC_PATHS, f"{method} {template} is public: add it to PUBLIC_PATHS only if it must be"
            assert "WWW-Authenticate" not in r.headers, (method, path, r.status_code, r.text[:200])  # no guard refusal
            continue
        assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
        assert "error" in r.json()


def test_a_browser_without_a_session_is_sent_to_the_login_page(anon: Any) -> None:
    r = anon.get("/instances/1?range=1h", headers={"accept": "text/html"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=/instances/1%3Frange%3D1h"
    page = anon.get(r.headers["location"])
    assert page.status_code == 200 and 'name="password"' in page.text


def test_a_viewer_may_read_but_changes_nothing(app: Any, as_role: Any) -> None:
    viewer = as_role("viewer")
    assert viewer.get("/api/v1/instances").status_code == 200
    for method, path, need in _routes(app):
        if need in (PUBLIC, VIEWER, AGENT):
            continue
        r = viewer.request(method, path, follow_redirects=False)
        assert r.status_code == 403, (method, path, r.status_code, r.text[:200])


def test_an_agent_token_is_refused_on_every_route_not_for_agents_and_people_on_the_agent_routes(
    app: Any, anon: Any, token: str, as_role: Any
) -> None:
    admin = as_role("admin")
    for method, path, need in _routes(app):
        if need == PUBLIC:
            continue
        if need == AGENT:
            r = admin.request(method, path, follow_redirects=False)
            assert r.status_code == 403 and "agent token" in r.json()["error"], (method, path, r.status_code)
            continue
        r = anon.request(method, path, headers={"Authorization": f"Bearer {token}"}, follow_redirects=False)
        assert r.status_code == 403, (method, path, r.status_code, r.text[:200])


def test_state_changes_found_open_are_refused_to_viewers(as_role: Any) -> None:
    viewer = as_role("viewer")
    spec = {"name": "evil", "spec": {"extra_args": ["--enforce-eager"]}}
    assert viewer.post("/api/v1/profiles", json=spec).status_code == 403
    assert viewer.post("/api/v1/rollouts", json={"instance": 1, "profile": "evil"}).status_code == 403
    assert viewer.post("/api/v1/alerts/silences", json={"minutes": 43200}).status_code == 403
    assert viewer.post("/api/v1/experiments", json={"instance": 1, "b": "evil"}).status_code == 403
    operator = as_role("operator")
    assert operator.post("/api/v1/profiles", json=spec).status_code in (200, 201)


def test_only_admins_manage_users_and_tokens(app: Any, as_role: Any) -> None:
    operator, admin = as_role("operator"), as_role("admin")
    body = {"name": "bob", "role": "viewer", "password": "a long enough password"}
    assert operator.post("/api/v1/users", json=body).status_code == 403
    assert operator.post("/api/v1/tokens", json={"name": "x", "role": "admin"}).status_code == 403
    assert operator.get("/api/v1/tokens").status_code == 403
    assert admin.post("/api/v1/users", json=body).status_code == 201
    assert [u["name"] for u in admin.get("/api/v1/users").json()["users"]] == ["bob"]
    assert "password" not in admin.get("/api/v1/users").text
    for method, path, need in _routes(app):
        if need == ADMIN:
            assert operator.request(method, path).status_code == 403, (method, path)


def test_requested_by_is_the_caller_not_what_the_body_claims(
    app: Any, as_role: Any, client: Any, token: str, clock: Any
) -> None:
    r = client.post("/api/v1/ingest", json=make_batch(1, clock()), headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    assert client.post("/api/v1/profiles", json={"name": "p", "spec": {}}).status_code in (200, 201)
    operator = as_role("operator")
    me = operator.get("/api/v1/whoami").json()["name"]
    r = operator.post("/api/v1/rollouts", json={"instance": iid, "profile": "p", "requested_by": "admin"})
    assert r.status_code == 201, r.text
    assert r.json()["requested_by"] == f"token:{me} (admin)"  # the caller first; the claim only as a note


def test_a_foreign_host_header_is_refused_so_dns_rebinding_cannot_drive_the_app(client: Any) -> None:
    r = client.post("/api/v1/profiles", json={"name": "x", "spec": {}}, headers={"host": "rebind.attacker.example"})
    assert r.status_code == 400 and "KVSCOPE_ALLOWED_HOSTS" in r.json()["error"]
    assert client.get("/healthz", headers={"host": "rebind.attacker.example:8080"}).status_code == 400
    assert client.get("/healthz", headers={"host": "localhost:8080"}).status_code == 200


def test_html_error_pages_escape_the_path(client: Any) -> None:
    r = client.get("/profiles/%3Cimg%20src=x%20onerror=alert(1)%3E", headers={"accept": "text/html"})
    assert r.status_code == 404
    assert ("<img" not in r.text and "onerror=alert(1)&gt;" in r.text) or "&lt;img" in r.text


def test_every_response_carries_the_security_headers(client: Any, anon: Any) -> None:
    for r in (client.get("/"), anon.get("/login"), anon.get("/healthz"), anon.get("/static/css/kvscope.css")):
        csp = r.headers["content-security-policy"]
        script_src = next(p for p in csp.split(";") if p.strip().startswith("script-src"))
        assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src
        assert "frame-ancestors 'none'" in csp
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "same-origin"


def test_an_agent_token_pushes_only_for_its_own_host(client: Any, engine: Any, clock: Any) -> None:
    rig2 = create_token(engine, "rig2", clock())  # bound to host rig2 by its name
    ok = client.post(
        "/api/v1/ingest", json=make_batch(1, clock(), host="rig2"), headers={"Authorization": f"Bearer {rig2}"}
    )
    assert ok.status_code == 200, ok.text
    r = client.post(
        "/api/v1/ingest", json=make_batch(2, clock(), host="rig1"), headers={"Authorization": f"Bearer {rig2}"}
    )
    assert r.status_code == 403 and "bound to host 'rig2'" in r.json()["error"]
    hosts = {i["host"] for i in client.get("/api/v1/instances").json()["instances"]}
    assert hosts == {"rig2"}
    poll = client.post(
        "/api/v1/commands", json={"agent_id": "a", "host": "rig1"}, headers={"Authorization": f"Bearer {rig2}"}
    )
    assert poll.status_code == 403


def test_an_agent_token_cannot_use_the_api_and_an_api_token_cannot_push(client: Any, token: str, as_role: Any) -> None:
    agent = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/v1/instances", headers=agent).status_code == 403
    assert client.post("/api/v1/profiles", json={"name": "x", "spec": {}}, headers=agent).status_code == 403
    admin = as_role("admin")
    assert admin.post("/api/v1/ingest", json=make_batch(1, time.time())).status_code == 403


def test_a_rollout_update_for_another_hosts_rollout_is_ignored(client: Any, engine: Any, clock: Any) -> None:
    from app.storage import rollouts_store as rs

    rig1 = create_token(engine, "rig1", clock())
    rig2 = create_token(engine, "rig2", clock())
    for seq, (host, tok) in enumerate((("rig1", rig1), ("rig2", rig2)), start=1):
        b = make_batch(seq, clock(), host=host, agent_id=f"agent-{host}", instance=f"http://{host}:8000")
        assert client.post("/api/v1/ingest", json=b, headers={"Authorization": f"Bearer {tok}"}).status_code == 200
    inst = {i["host"]: i["id"] for i in client.get("/api/v1/instances").json()["instances"]}
    assert client.post("/api/v1/profiles", json={"name": "p", "spec": {}}).status_code in (200, 201)
    rid = client.post("/api/v1/rollouts", json={"instance": inst["rig1"], "profile": "p"}).json()["id"]
    forged = make_batch(3, clock(), host="rig2", agent_id="agent-rig2", instance="http://rig2:8000")
    forged["rollout_updates"] = [{"rollout_id": rid, "state": "healthy", "ts": clock(), "message": "forged"}]
    assert client.post("/api/v1/ingest", json=forged, headers={"Authorization": f"Bearer {rig2}"}).status_code == 200
    assert rs.get_rollout(engine, rid)["state"] in ("requested", "claimed")
    # ... nor from the right host before the rollout was handed to it.
    early = make_batch(4, clock(), host="rig1", agent_id="agent-rig1", instance="http://rig1:8000")
    early["rollout_updates"] = [{"rollout_id": rid, "state": "healthy", "ts": clock(), "message": "early"}]
    assert client.post("/api/v1/ingest", json=early, headers={"Authorization": f"Bearer {rig1}"}).status_code == 200
    assert rs.get_rollout(engine, rid)["state"] in ("requested", "claimed")


def test_a_revoked_token_stops_working_at_once(client: Any, engine: Any, clock: Any) -> None:
    tok = create_token(engine, "script", clock(), role="viewer")
    h = {"Authorization": f"Bearer {tok}"}
    assert client.get("/api/v1/instances", headers=h).status_code == 200
    assert revoke_token(engine, "script", clock())
    assert client.get("/api/v1/instances", headers=h).status_code == 401


def _login(c: Any, name: str, password: str) -> Any:
    page = c.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf
    return c.post(
        "/login",
        data={"name": name, "password": password, "csrf": csrf.group(1), "next": "/alerts"},
        headers={"origin": "http://testserver"},
        follow_redirects=False,
    )


def test_login_sets_a_signed_httponly_samesite_session_and_logout_ends_it(anon: Any, engine: Any) -> None:
    create_user(engine, "alice", "operator", hash_password("correct horse battery"), time.time())
    r = _login(anon, "alice", "correct horse battery")
    assert r.status_code == 303 and r.headers["location"] == "/alerts"
    cookie = next(v for k, v in r.headers.multi_items() if k == "set-cookie" and v.startswith("kvscope_session="))
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie
    assert anon.get("/api/v1/whoami").json() == {"kind": "user", "name": "alice", "role": "operator"}
    forged = anon.cookies.get("kvscope_session")[:-2] + "00"
    anon.cookies.set("kvscope_session", forged)
    assert anon.get("/api/v1/whoami").status_code == 401


def test_a_password_change_ends_existing_sessions(anon: Any, engine: Any) -> None:
    create_user(engine, "alice", "viewer", hash_password("correct horse battery"), time.time())
    assert _login(anon, "alice", "correct horse battery").status_code == 303
    assert anon.get("/api/v1/whoami").status_code == 200
    set_password(engine, "alice", hash_password("another long password"))
    assert anon.get("/api/v1/whoami").status_code == 401


def test_failed_logins_are_rate_limited(anon: Any, engine: Any, app: Any) -> None:
    create_user(engine, "alice", "viewer", hash_password("correct horse battery"), time.time())
    limit = app.state.ctx.settings.auth.login_max_failures
    for _ in range(limit):
        assert _login(anon, "alice", "wrong password!").status_code == 401
    r = _login(anon, "alice", "correct horse battery")
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0


def test_login_next_never_leaves_the_site(anon: Any, engine: Any) -> None:
    from app.auth.pages import safe_next

    for bad in ("//evil.example/", "https://evil.example", "/\\evil.example", "", None, "/login?x"):
        assert safe_next(bad) == "/"
    assert safe_next("/instances/2?range=1h") == "/instances/2?range=1h"


def test_a_one_time_login_link_works_once(anon: Any, engine: Any, tmp_path: Any, clock: Any) -> None:
    from app.auth import local_access

    access = local_access.prepare(engine, tmp_path, clock())
    assert access.admin_created and access.login_path.startswith("/login/once?t=")
    r = anon.get(access.login_path, follow_redirects=False)
    assert r.status_code == 303
    assert anon.get("/api/v1/whoami").json()["role"] == "admin"
    anon.cookies.clear()
    assert anon.get(access.login_path, follow_redirects=False).status_code == 401
    token_file = access.api_token_file
    assert token_file.stat().st_mode & 0o777 == 0o600
    h = {"Authorization": "Bearer " + token_file.read_text().strip()}
    assert anon.get("/api/v1/whoami", headers=h).json()["role"] == "operator"
    again = local_access.prepare(engine, tmp_path, clock())  # a restart: no second admin, old CLI token revoked
    assert not again.admin_created
    assert anon.get("/api/v1/whoami", headers=h).status_code == 401


@pytest.mark.parametrize("secret", ["x", "change-me", "short-but-not-placeholder"])
def test_a_short_or_placeholder_secret_is_refused_off_loopback(secret: str, tmp_path: Any) -> None:
    from app.settings import load_settings
    from kvscope.errors import UserError

    s = load_settings(None, data_dir=str(tmp_path), host="0.0.0.0", secret_key=secret)
    with pytest.raises(UserError, match="32 bytes"):
        s.check_for_bind()
    load_settings(None, data_dir=str(tmp_path), host="0.0.0.0", secret_key="k" * 32).check_for_bind()


def test_on_loopback_a_placeholder_secret_becomes_a_random_key_kept_private(tmp_path: Any) -> None:
    from app.auth.secret import effective_secret
    from app.settings import load_settings

    s = load_settings(None, data_dir=str(tmp_path))
    key = effective_secret(s)
    assert key != s.auth.secret_key and len(key) >= 32
    assert effective_secret(s) == key
    assert (tmp_path / "secret-key").stat().st_mode & 0o777 == 0o600


def test_public_dashboards_open_reads_but_never_changes(tmp_path: Any) -> None:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings

    s = load_settings(
        None, data_dir=str(tmp_path), run_scheduler=False, public_dashboards=True, allowed_hosts=["testserver"]
    )
    with TestClient(create_app(s, start_jobs=False)) as c:
        assert c.get("/api/v1/instances").status_code == 200
        assert c.get("/", headers={"accept": "text/html"}).status_code == 200
        assert c.post("/api/v1/profiles", json={"name": "x", "spec": {}}).status_code == 401
        assert c.get("/api/v1/users").status_code == 401


# The state-changing routes this change added or opened to roles, each named: an anonymous caller
# gets 401, an under-privileged one 403, and nothing changes.
ROLE_GUARDED = [
    ("POST", "/api/v1/alerts/1/ack", {"note": "x"}, "viewer"),
    ("POST", "/api/v1/alerts/silences", {"minutes": 60}, "viewer"),
    ("POST", "/api/v1/users", {"name": "mallory", "role": "admin", "password": "a long password!"}, "operator"),
    ("PUT", "/api/v1/users/alice/password", {"password": "another long password"}, "operator"),
    ("DELETE", "/api/v1/users/alice", None, "operator"),
]


@pytest.mark.parametrize(("method", "path", "body", "too_low"), ROLE_GUARDED)
def test_each_new_state_change_refuses_anonymous_and_under_privileged_callers(
    method: str, path: str, body: Any, too_low: str, anon: Any, as_role: Any, engine: Any
) -> None:
    create_user(engine, "alice", "viewer", hash_password("correct horse battery"), time.time())
    kw = {"json": body} if body is not None else {}
    r = anon.request(method, path, **kw)
    assert r.status_code == 401, (method, path, r.text)
    r = as_role(too_low).request(method, path, **kw)
    assert r.status_code == 403 and "role" in r.json()["error"], (method, path, r.text)
    from app.storage.alerts_store import active_silences
    from app.storage.users_store import list_users, user_by_name

    assert [u.name for u in list_users(engine)] == ["alice"]
    user = user_by_name(engine, "alice")
    assert user is not None and user.session_epoch == 0  # password untouched
    assert active_silences(engine, time.time()) == []


def test_processes_starting_together_share_one_secret_key(tmp_path: Any) -> None:
    import threading

    from app.auth.secret import _stored_secret

    path, keys = tmp_path / "secret-key", []
    threads = [threading.Thread(target=lambda: keys.append(_stored_secret(path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert path.read_text().strip() == keys[0]
