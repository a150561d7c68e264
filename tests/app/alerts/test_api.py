"""The alerts API and pages on the real app: JSON, 4xx with messages, acknowledge, silence,
per-instance overrides, "send test", the banner, same-origin form posts, settings validation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.web.jobs import run_job_now
from kvscope.errors import UserError
from tests.app.alerts.receiver import Receiver, receiver
from tests.conftest import api_token


@pytest.fixture
def hook() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


@pytest.fixture
def live(tmp_path: Any, clock: Any, hook: Receiver) -> Iterator[tuple[Any, Any]]:
    """(client, ctx) of an app with one webhook channel and one host whose agent went silent."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import load_settings
    from app.storage.tokens import create_token
    from tests.conftest import make_batch

    settings = load_settings(
        None,
        data_dir=str(tmp_path / "d"),
        run_scheduler=False,
        alert_channels=[{"name": "hook", "kind": "webhook", "url": hook.url}],
    )
    app = create_app(settings, clock=clock, start_jobs=False)
    ctx = app.state.ctx
    token = create_token(ctx.engine, "a", clock(), host="rig1")
    with TestClient(app) as c:
        c.headers["Authorization"] = "Bearer " + api_token(ctx.engine)
        r = c.post("/api/v1/ingest", json=make_batch(1, clock()), headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
        yield c, ctx
    ctx.engine.dispose()


def _token(c: Any, page: str = "/alerts") -> str:
    """The signed form token the page hands out (its cookie stays in the client's jar)."""
    import re

    m = re.search(r'name="csrf" value="([^"]+)"', c.get(page).text)
    assert m, page
    return m.group(1)


def _fire_stale(ctx: Any, clock: Any) -> None:
    clock.advance(600)
    run_job_now(ctx, "alerts", clock())


def test_alerts_json_and_detail(live: tuple[Any, Any], clock: Any) -> None:
    c, ctx = live
    assert c.get("/api/v1/alerts").json()["alerts"] == []
    _fire_stale(ctx, clock)
    (a,) = c.get("/api/v1/alerts").json()["alerts"]
    assert (a["rule"], a["state"], a["host"], a["since"], a["value"]) == ("agent_stale", "firing", "rig1", clock(), 600)
    assert set(a) >= {"rule", "instance", "state", "since", "value", "baseline", "hints"}
    d = c.get(f"/api/v1/alerts/{a['id']}").json()
    assert [t["to_state"] for t in d["transitions"]] == ["firing", "pending"]
    assert [x["status"] for x in d["deliveries"]] == ["pending"]
    assert c.get("/api/v1/alerts", params={"state": "resolved"}).json()["alerts"] == []


@pytest.mark.parametrize(
    ("url", "status", "words"),
    [
        ("/api/v1/alerts?state=bogus", 400, "state must be one of"),
        ("/api/v1/alerts?rule=nope", 400, "unknown rule"),
        ("/api/v1/alerts?limit=0", 422, "limit"),
        ("/api/v1/alerts/999", 404, "no alert 999"),
        ("/api/v1/alerts/abc", 422, "alert_id"),
    ],
)
def test_bad_requests_get_4xx_with_a_message(live: tuple[Any, Any], url: str, status: int, words: str) -> None:
    c, _ = live
    r = c.get(url)
    assert r.status_code == status and words in r.json()["error"]


def test_ack_and_silence_through_the_api(live: tuple[Any, Any], clock: Any, hook: Receiver) -> None:
    c, ctx = live
    _fire_stale(ctx, clock)
    (a,) = c.get("/api/v1/alerts").json()["alerts"]
    assert c.post(f"/api/v1/alerts/{a['id']}/ack", json={"note": "on it"}).json() == {
        "acknowledged": True,
        "already": False,
    }
    assert c.post(f"/api/v1/alerts/{a['id']}/ack", json={}).json()["already"] is True
    assert c.post("/api/v1/alerts/999/ack", json={}).status_code == 404
    r = c.post(f"/api/v1/alerts/{a['id']}/ack", data={"note": "x"})  # a cross-site form could send this
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    assert c.get("/api/v1/alerts").json()["alerts"][0]["acked"] is True
    for body, status in (
        ({"minutes": -1}, 400),
        ({"minutes": "x"}, 400),
        ({"minutes": 5, "rule": "nope"}, 400),
        ({"minutes": 5, "instance": 42}, 404),
        ({"minutes": 5, "host": 42}, 404),
    ):
        r = c.post("/api/v1/alerts/silences", json=body)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]
    assert (
        c.post("/api/v1/alerts/silences", content=b"{", headers={"content-type": "application/json"}).status_code == 400
    )
    r = c.post("/api/v1/alerts/silences", json={"minutes": 30, "rule": "agent_stale", "reason": "maintenance"})
    assert r.status_code == 201
    assert c.get("/api/v1/alerts").json()["alerts"][0]["silenced"] is True


def test_silenced_alerts_do_not_notify_and_leave_the_banner(live: tuple[Any, Any], clock: Any, hook: Receiver) -> None:
    c, ctx = live
    r = c.post("/api/v1/alerts/silences", json={"minutes": 60, "host": 1})
    assert r.status_code == 201
    _fire_stale(ctx, clock)
    run_job_now(ctx, "alerts_delivery", clock())
    assert hook.requests == []
    (a,) = c.get("/api/v1/alerts").json()["alerts"]
    assert a["silenced"] is True
    assert "alert-banner" not in c.get("/fragments/alerts/banner").text


def test_banner_on_every_page_while_firing(live: tuple[Any, Any], clock: Any) -> None:
    c, ctx = live
    assert "alert-banner" not in c.get("/").text
    _fire_stale(ctx, clock)
    for page in ("/", "/alerts"):
        html = c.get(page).text
        assert "alert-banner" in html and "1 alert firing" in html and "Agent stale" in html
    (a,) = c.get("/api/v1/alerts").json()["alerts"]
    c.post(f"/api/v1/alerts/{a['id']}/ack", json={})
    html = c.get("/").text
    assert "alert-banner" not in html


def test_pages_render_and_forms_work(live: tuple[Any, Any], clock: Any, hook: Receiver) -> None:
    c, ctx = live
    _fire_stale(ctx, clock)
    (a,) = c.get("/api/v1/alerts").json()["alerts"]
    page = c.get("/alerts").text
    assert "Agent stale" in page and "History" in page and "Send test" in page
    assert "Agent stale" in c.get(f"/alerts/{a['id']}").text
    assert c.get("/alerts/999").status_code == 404
    # acknowledge from the page (same origin, signed token) then silence for a duration
    tok = _token(c)
    r = c.post(
        f"/alerts/{a['id']}/ack",
        data={"note": "x", "csrf": tok},
        headers={"origin": "http://testserver"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"].startswith(f"/alerts/{a['id']}?msg=acknowledged")
    r = c.post(
        "/alerts/silences",
        data={"rule": "agent_stale", "host": "1", "minutes": "15", "csrf": tok},
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert c.get("/api/v1/alerts").json()["alerts"][0]["silenced"] is True
    r = c.post(
        "/alerts/silences", data={"minutes": "1", "back": "https://evil.example/", "csrf": tok}, follow_redirects=False
    )
    assert r.headers["location"].startswith("/alerts?msg=")  # no open redirect
    assert "Expire" in c.get("/alerts").text  # the active silence is listed with its button
    # cross-site form posts, and posts without the signed token, are refused
    r = c.post(f"/alerts/{a['id']}/ack", data={"csrf": tok}, headers={"origin": "http://evil.example"})
    assert r.status_code == 403 and "cross-site" in r.json()["error"]
    r = c.post(f"/alerts/{a['id']}/ack", data={"csrf": "forged"})
    assert r.status_code == 403 and "form token" in r.json()["error"]
    # send test: one POST to the channel, outcome in the redirect
    r = c.post("/alerts/channels/hook/test", data={"csrf": tok}, follow_redirects=False)
    assert r.status_code == 303 and "sent" in r.headers["location"]
    assert [q.json()["event"] for q in hook.requests] == ["test"]
    hook.status = 500
    r = c.post("/alerts/channels/hook/test", data={"csrf": tok}, follow_redirects=False)
    assert "FAILED" in r.headers["location"] and "HTTP%20500" in r.headers["location"]
    assert "HTTP 500" in c.get("/alerts").text  # failures are visible on the page
    assert c.post("/alerts/channels/nope/test", data={"csrf": tok}).status_code == 404


def test_per_instance_overrides_from_the_ui(live: tuple[Any, Any], clock: Any) -> None:
    c, ctx = live
    assert "hit_rate_drop_overall" in c.get("/alerts/rules").text
    tok = _token(c, "/alerts/rules")
    r = c.post(
        "/alerts/rules/1/hit_rate_drop_overall",
        data={"for_s": "30", "abs_margin": "0.2", "enabled": "on", "csrf": tok},
        follow_redirects=False,
    )
    assert r.status_code == 303 and "saved" in r.headers["location"]
    from app.alerts.params import effective
    from app.storage.alerts_store import all_overrides

    ov = all_overrides(ctx.engine)[(1, "hit_rate_drop_overall")]
    assert ov == {"for_s": 30.0, "abs_margin": 0.2}
    assert effective("hit_rate_drop_overall", ctx.settings.alerts.rules, ov)["for_s"] == 30.0
    assert 'value="30.0"' in c.get("/alerts/rules?instance=1").text
    r = c.post("/alerts/rules/1/hit_rate_drop_overall", data={"for_s": "soon", "csrf": tok}, follow_redirects=False)
    assert "not%20saved" in r.headers["location"]
    # unchecking "enabled" turns the rule off for this instance only
    c.post("/alerts/rules/1/hit_rate_drop_overall", data={"for_s": "30", "csrf": tok})
    assert all_overrides(ctx.engine)[(1, "hit_rate_drop_overall")]["enabled"] is False
    c.post("/alerts/rules/1/hit_rate_drop_overall", data={"reset": "1", "csrf": tok})
    assert (1, "hit_rate_drop_overall") not in all_overrides(ctx.engine)
    assert c.post("/alerts/rules/1/agent_stale", data={"csrf": tok}).status_code == 404  # host rule: settings only
    assert c.post("/alerts/rules/99/ttft_p95", data={"csrf": tok}).status_code == 404


def test_the_app_refuses_at_start_a_rule_or_parameter_that_does_not_exist(tmp_path: Any) -> None:
    from app.alerts.views import evaluator
    from app.main import create_app
    from app.settings import load_settings

    def started(rules: dict[str, Any]) -> Any:
        s = load_settings(None, data_dir=str(tmp_path), alert_rules=rules)
        return create_app(s, start_jobs=False)

    app = started({"ttft_p95": {"budget_s": "0.5", "enabled": "yes"}})
    assert evaluator(app.state.ctx).rule_settings == {"ttft_p95": {"budget_s": 0.5, "enabled": True}}
    with pytest.raises(UserError, match=r"bad setting alerts\.rules: unknown alert rule"):
        started({"nope": {}})
    with pytest.raises(UserError, match="has no parameter"):
        started({"ttft_p95": {"budget": 1}})
    with pytest.raises(UserError, match="must be a number"):
        started({"ttft_p95": {"budget_s": "soon"}})


def test_a_bad_rule_setting_stops_the_app_before_the_database_is_opened(tmp_path: Any) -> None:
    """`kvscope serve` with an unknown rule used to migrate the database first and then stop."""
    from app.main import create_app
    from app.settings import load_settings

    s = load_settings(None, data_dir=str(tmp_path), alert_rules={"nope": {}})
    db = tmp_path / "kvscope.db"
    assert s.effective_database_url == f"sqlite:///{db}"
    with pytest.raises(UserError, match=r"bad setting alerts\.rules: unknown alert rule"):
        create_app(s, start_jobs=False)
    assert not db.exists()  # nothing created, nothing migrated


def test_settings_refuse_rule_tables_of_the_wrong_shape_or_size(tmp_path: Any) -> None:
    from app.settings import MAX_RULE_OVERRIDES, MAX_RULE_PARAMS, load_settings

    with pytest.raises(UserError, match=r"alerts\.rules\.ttft_p95 .*valid dictionary"):
        load_settings(None, data_dir=str(tmp_path), alert_rules={"ttft_p95": 3})
    with pytest.raises(UserError, match="at most"):
        load_settings(None, data_dir=str(tmp_path), alert_rules={f"r{i}": {} for i in range(MAX_RULE_OVERRIDES + 1)})
    with pytest.raises(UserError, match="parameters"):
        load_settings(
            None, data_dir=str(tmp_path), alert_rules={"ttft_p95": {f"p{i}": 1 for i in range(MAX_RULE_PARAMS + 1)}}
        )
    with pytest.raises(UserError, match="short string"):
        load_settings(None, data_dir=str(tmp_path), alert_rules={"ttft_p95": {"budget_s": [1, 2]}})
    with pytest.raises(UserError, match="short string"):
        load_settings(None, data_dir=str(tmp_path), alert_rules={"ttft_p95": {"budget_s": "x" * 257}})


def test_settings_validate_channels_and_read_both_toml_forms(tmp_path: Any) -> None:
    from app.settings import load_settings

    with pytest.raises(UserError, match="unique"):
        load_settings(
            None,
            data_dir=str(tmp_path),
            alert_channels=[
                {"name": "a", "kind": "ntfy", "url": "https://ntfy.sh/x"},
                {"name": "a", "kind": "slack", "url": "https://hooks.slack.com/x"},
            ],
        )
    with pytest.raises(UserError, match="http"):
        load_settings(None, data_dir=str(tmp_path), alert_channels=[{"name": "a", "kind": "ntfy", "url": "ftp://x"}])
    cfg = tmp_path / "kvscope.toml"
    cfg.write_text(
        '[alert_rules.hit_rate_drop_overall]\nfor_s = 60\n\n[[alert_channels]]\nname = "am"\n'
        'kind = "alertmanager"\nurl = "http://127.0.0.1:9093"\nmin_severity = "warning"\n'
    )
    s = load_settings(cfg, data_dir=str(tmp_path))  # the flat form of before the sections still reads
    assert s.alerts.rules["hit_rate_drop_overall"]["for_s"] == 60
    assert s.alerts.channels[0].kind == "alertmanager" and not s.alerts.channels[0].wants("ttft_p95", "info")
    cfg.write_text(
        '[alerts.rules.hit_rate_drop_overall]\nfor_s = 60\n\n[[alerts.channels]]\nname = "am"\n'
        'kind = "alertmanager"\nurl = "http://127.0.0.1:9093"\nmin_severity = "warning"\n'
    )
    nested = load_settings(cfg, data_dir=str(tmp_path))
    assert nested.alerts == s.alerts
