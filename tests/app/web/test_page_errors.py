"""Every page route answers a refusal in the dashboard's frame (app/web/errors.py), from FastAPI's
own parameter checks: typed ids and ranges, no id parsed by hand; the JSON API keeps JSON."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.parametrize(
    "path",
    ["/instances/abc", "/instances/abc/sizing", "/hosts/abc/sizing", "/instances/99999999999/sizing", "/instances/0"],
)
def test_a_malformed_id_on_any_page_is_a_404_page_in_the_frame(client: Any, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404, r.text[:200]
    assert r.headers["content-type"].startswith("text/html")
    assert 'data-error="404"' in r.text and "Back to the overview" in r.text
    assert "database id" in r.text  # the id's declared description says what an id is


def test_a_bad_query_on_a_page_names_the_parameter_and_what_it_takes(client: Any) -> None:
    r = client.get("/instances/1?range=" + "x" * 40)
    assert r.status_code == 422 and r.headers["content-type"].startswith("text/html")
    assert "range (5m, 15m, 1h" in r.text and "x" * 41 not in r.text


def test_the_json_api_answers_json_for_the_same_mistakes(client: Any) -> None:
    r = client.get("/api/v1/instances/abc/sizing")
    assert r.status_code == 422 and r.json()["error"].startswith("invalid request")
