"""Every route of the real app, read from the app object (app.routes, through its included routers
and mounts: app.auth.route_table), never from a hand-kept list: each states its role, an async one
awaits something, the OpenAPI schema builds, and bad path values or bodies get a 4xx with a message
(or a page), never a 500 or a traceback. The role refusals of the same table: tests/security."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import Any

import pytest
from fastapi import FastAPI

from app.auth.roles import AGENT, PEOPLE_ROLES, PUBLIC, VIEWER, requires
from app.auth.route_table import endpoints, role_table, undeclared_routes
from app.web.deps import MAX_RANGE_CHARS

BAD_PATH_VALUES = ["1", "abc", "-1", "999999", "1e309", "%20", "..%2F..%2Fetc"]
BAD_BODIES: list[bytes | None] = [None, b"{", b"[]", b'{"name": 5, "spec": []}', b"\xff\xfe"]


def test_the_route_table_is_read_from_the_app_with_every_part_in_it(app: Any) -> None:
    paths = {p for _m, p, _r in role_table(app)}
    assert len(role_table(app)) > 80
    for one_per_part in (
        "/api/v1/ingest",  # ingest
        "/instances/{instance_id}",  # dashboard page (not in the OpenAPI schema)
        "/static/{path}",  # the static mount
        "/profiles",  # controller pages
        "/alerts/rules",  # alert pages
        "/experiments/{experiment_id}",  # A/B pages
        "/api/v1/prometheus/instances/{instance_id}/charts/{key}",  # export
        "/instances/{instance_id}/sizing",  # sizing
        "/login",  # auth
        "/api/docs",  # web
    ):
        assert one_per_part in paths, one_per_part


def test_every_route_states_its_role(app: Any) -> None:
    assert undeclared_routes(app) == [], "add @requires(VIEWER | OPERATOR | ADMIN | AGENT | PUBLIC) under the route"
    assert {role for _m, _p, role in role_table(app)} <= {*PEOPLE_ROLES, AGENT, PUBLIC}


def test_a_route_without_a_stated_role_is_found_by_the_sweep() -> None:
    probe = FastAPI()

    @probe.get("/forgot")
    def forgot() -> dict[str, str]:
        return {}

    @probe.get("/stated")
    @requires(VIEWER)
    def stated() -> dict[str, str]:
        return {}

    assert undeclared_routes(probe) == [("GET", "/forgot")]
    assert ("GET", "/forgot", VIEWER) in role_table(probe)  # the fallback keeps it closed


def _awaits(func: Any) -> bool:
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return any(isinstance(node, (ast.Await, ast.AsyncFor, ast.AsyncWith)) for node in ast.walk(tree))


def test_a_route_is_async_only_when_it_awaits_something(app: Any) -> None:
    # the one convention (app/web/deps.py): sync def (FastAPI's thread pool) unless the route
    # awaits a body, a form, the page-work limiter or the long-poll
    lazy = [
        f"{method} {path}"
        for method, path, endpoint in endpoints(app)
        if inspect.iscoroutinefunction(endpoint) and not _awaits(endpoint)
    ]
    assert lazy == []


def test_openapi_schema_and_docs(client: Any) -> None:
    r = client.get("/api/openapi.json")
    assert r.status_code == 200, r.text[:300]
    assert "/api/v1/ingest" in r.json()["paths"]
    assert client.get("/api/docs").status_code == 200


def _bodies(method: str, path: str) -> list[bytes | None]:
    """Bad bodies for a route: every one for the JSON API; for a form post (its CSRF check comes
    before its fields are read) an empty and an undecodable one."""
    if method == "GET":
        return [None]
    return BAD_BODIES if path.startswith("/api/") else [None, b"\xff\xfe"]


def test_no_route_answers_5xx_to_bad_input(app: Any, client: Any, token: str, clock: Any, batch_factory: Any) -> None:
    # one real host and instance (id 1), so "1" reaches the code past the not-found checks
    r = client.post("/api/v1/ingest", json=batch_factory(1, clock()), headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    origin = str(client.base_url).rstrip("/")
    problems: list[tuple[Any, ...]] = []
    n = 0
    for method, path, _role in role_table(app):
        if path in ("/logout", "/login/once"):
            continue  # they end or start a session: the admin client would log itself out
        for v in BAD_PATH_VALUES:
            url = re.sub(r"\{[^}]+\}", v, path)
            for body in _bodies(method, path):
                r = client.request(
                    method, url, content=body, headers={"content-type": "application/json", "origin": origin}
                )
                n += 1
                if r.status_code >= 500 or "Traceback" in r.text:
                    problems.append((method, url, body, r.status_code, r.text[:200]))
    assert n > 500
    assert problems == []


def test_a_range_name_past_its_cap_is_refused_with_a_message(client: Any) -> None:
    long = "x" * (MAX_RANGE_CHARS + 1)
    r = client.get(f"/api/v1/instances/1/summary?range={long}")
    assert r.status_code == 422 and "range" in r.json()["error"]
    assert client.get(f"/api/v1/instances/1/sizing?range={long}").status_code == 422
    assert client.get("/api/v1/instances/1/summary?range=bogus").status_code in (400, 404)


@pytest.mark.parametrize("path", ["/", "/alerts", "/profiles", "/experiments", "/instances/1", "/nope"])
def test_pages_answer_without_data(client: Any, path: str) -> None:
    r = client.get(path, headers={"accept": "text/html"})
    assert r.status_code in (200, 404)
    assert "Traceback" not in r.text
