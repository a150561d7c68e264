"""Every route of the real app: the OpenAPI schema builds, and bad path values or bodies get a 4xx
with a message (or a page), never a 500 or a traceback."""

from __future__ import annotations

import re
from typing import Any

import pytest

BAD_PATH_VALUES = ["1", "abc", "-1", "999999", "1e309", "%20", "..%2F..%2Fetc"]
BAD_BODIES: list[bytes | None] = [None, b"{", b"[]", b'{"name": 5, "spec": []}', b"\xff\xfe"]


def test_openapi_schema_and_docs(client: Any) -> None:
    r = client.get("/api/openapi.json")
    assert r.status_code == 200, r.text[:300]
    assert "/api/v1/ingest" in r.json()["paths"]
    assert client.get("/api/docs").status_code == 200


def test_no_route_answers_5xx_to_bad_input(client: Any, token: str, clock: Any, batch_factory: Any) -> None:
    # one real host and instance (id 1), so "1" reaches the code past the not-found checks
    r = client.post("/api/v1/ingest", json=batch_factory(1, clock()), headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    paths = client.get("/api/openapi.json").json()["paths"]
    origin = str(client.base_url).rstrip("/")
    problems: list[tuple[Any, ...]] = []
    n = 0
    for path, ops in paths.items():
        for method in ops:
            for v in BAD_PATH_VALUES:
                url = re.sub(r"\{[^}]+\}", v, path)
                for body in BAD_BODIES if method != "get" else [None]:
                    r = client.request(
                        method.upper(),
                        url,
                        content=body,
                        headers={"content-type": "application/json", "origin": origin},
                    )
                    n += 1
                    if r.status_code >= 500 or "Traceback" in r.text:
                        problems.append((method, url, body, r.status_code, r.text[:200]))
    assert n > 100
    assert problems == []


@pytest.mark.parametrize("path", ["/", "/alerts", "/profiles", "/experiments", "/instances/1", "/nope"])
def test_pages_answer_without_data(client: Any, path: str) -> None:
    r = client.get(path, headers={"accept": "text/html"})
    assert r.status_code in (200, 404)
    assert "Traceback" not in r.text
