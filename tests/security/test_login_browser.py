"""Issue 14, in a real Chromium: a person logs in through the form, applies a profile, logs out,
and is refused afterwards."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.auth.passwords import hash_password
from app.storage.users_store import create_user
from tests.browser.conftest import LiveApp, chromium_context, page  # noqa: F401  (fixtures)
from tests.conftest import api_token, make_batch

pytestmark = [pytest.mark.browser]
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def live(tmp_path_factory: Any, chromium_context: Any) -> Iterator[LiveApp]:  # noqa: F811
    app = LiveApp(tmp_path_factory.mktemp("login-app"))
    app.start()
    try:
        with httpx.Client(base_url=app.url) as c:
            r = c.post(
                "/api/v1/ingest", json=make_batch(1, time.time()), headers={"Authorization": f"Bearer {app.token}"}
            )
            assert r.status_code == 200, r.text
            admin = {"Authorization": "Bearer " + api_token(app.engine)}
            r = c.post(
                "/api/v1/profiles", json={"name": "eager", "spec": {"extra_args": ["--enforce-eager"]}}, headers=admin
            )
            assert r.status_code in (200, 201), r.text
        create_user(app.engine, "olga", "operator", hash_password(PASSWORD), time.time())
        yield app
    finally:
        app.stop()


def test_a_person_logs_in_applies_a_profile_logs_out_and_is_refused(live: LiveApp, page: Any) -> None:  # noqa: F811
    p, log = page
    p.context.clear_cookies()
    p.goto(live.url + "/instances/1/apply?profile=eager")
    assert "/login?next=" in p.url  # sent to the login page, and back after it
    p.fill("input[name=password]", "not the password")
    p.fill("input[name=name]", "olga")
    p.click("button[type=submit]")
    assert "Wrong user name or password" in p.inner_text(".flash.error")
    p.fill("input[name=password]", PASSWORD)
    p.click("button[type=submit]")
    p.wait_for_url(live.url + "/instances/1/apply?profile=eager")
    assert "olga (operator)" in p.inner_text(".whoami")
    p.click("form[method=post] button[type=submit]:has-text('Apply')")
    p.wait_for_url(f"{live.url}/rollouts/*")
    rollout_url = p.url
    assert "eager" in p.content()
    p.click(".whoami button")
    p.wait_for_url(live.url + "/login")
    p.goto(rollout_url)
    assert "/login?next=" in p.url
    # The session is gone for scripts in the same browser too.
    r = p.request.post(live.url + "/instances/1/apply", form={"profile": "eager"}, max_redirects=0)
    assert r.status == 401
    # the only error: the wrong password's page, answered 401 on purpose
    assert [e for e in log.errors if "status of 401" not in e] == [] and len(log.errors) == 1, log.errors
