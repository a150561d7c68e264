"""An instance its agent no longer scrapes (taken out of its targets, a server restarted on
another port) reads "gone": on the overview, the instance page, the JSON read and /metrics, and
it raises no instance-down alert; a backlog replayed after an outage is not taken for it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.alerts.catalog import RULES
from app.alerts.rule_io import TargetData
from app.alerts.rules_health import instance_down
from app.derived.fleet import instance_state
from app.storage.series_store import get_instance
from tests.app.dashboard.recorded import fed_app, push_all, recorded_batches

T0 = 1_800_000_000.0
OLD = "http://127.0.0.1:8000"
NEW = "http://127.0.0.1:8001"


@pytest.fixture(scope="module")
def moved(tmp_path_factory: Any) -> Any:
    """40 pushes scraping OLD, then the agent restarted with the server on NEW: 30 pushes
    (~150 s) scraping NEW only, as `kvscope demo` restarted on its data folder did."""
    first = recorded_batches(T0 - 600, 40, interval=5.0, instance=OLD)
    second = recorded_batches(first[-1]["sent_at"], 30, interval=5.0, instance=NEW, seq0=41, seed=8)
    with fed_app(tmp_path_factory.mktemp("gone"), first, second[-1]["sent_at"]) as (app, client, clock):
        from app.storage.tokens import create_token

        push_all(client, create_token(app.state.ctx.engine, "second", clock(), host="rig1"), second, clock)
        clock.t = second[-1]["sent_at"] + 3
        yield app, client, clock


def _ids(client: Any) -> dict[str, int]:
    got = client.get("/api/v1/instances").json()["instances"]
    return {i["url"]: int(i["id"]) for i in got}


def test_the_server_the_agent_left_reads_gone_and_the_one_it_scrapes_reads_up(moved: Any) -> None:
    _app, client, _clock = moved
    states = {i["url"]: i["state"] for i in client.get("/api/v1/instances").json()["instances"]}
    assert states == {OLD: "gone", NEW: "up"}
    html = client.get("/").text
    cards = re.findall(r'data-instance="(\d+)".*?data-state="(\w+)"', html, re.S)
    ids = _ids(client)
    assert cards == [(str(ids[NEW]), "up"), (str(ids[OLD]), "gone")]  # the scraped one first
    assert "its agent no longer scrapes it" in html
    page = client.get(f"/instances/{ids[OLD]}").text
    assert 'data-state="gone"' in page and "no longer scrapes" in page


def test_metrics_say_gone_and_export_no_rates_for_the_left_server(moved: Any) -> None:
    _app, client, _clock = moved
    got: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            if "vllm_url" in s.labels:
                got[(s.name, s.labels["vllm_url"])] = float(s.value)
    assert got[("kvscope_instance_gone", OLD)] == 1.0 and got[("kvscope_instance_up", OLD)] == 0.0
    assert got[("kvscope_instance_gone", NEW)] == 0.0 and got[("kvscope_instance_up", NEW)] == 1.0
    assert ("kvscope_instance_prompt_tokens_per_second", OLD) not in got
    assert any(name == "kvscope_instance_prompt_tokens_per_second" and url == NEW for name, url in got)


def test_the_left_server_raises_no_instance_down_alert(moved: Any) -> None:
    app, client, clock = moved
    params = dict(next(r for r in RULES if r.name == "instance_down").defaults)
    ids = _ids(client)
    old = get_instance(app.state.ctx.engine, ids[OLD])
    new = get_instance(app.state.ctx.engine, ids[NEW])
    assert old is not None and new is not None
    r = instance_down(TargetData(info=dict(old)), clock(), params)
    assert r.active is None and "gone" in r.message
    assert instance_down(TargetData(info=dict(new)), clock(), params).active is False


def _row(**kw: float | None) -> Any:
    return {"host_last_push": 1000.0, "last_ok": 990.0, "last_scrape": 990.0, "healthy": True, **kw}


def test_a_backlog_replayed_after_an_outage_is_not_taken_for_a_gone_server() -> None:
    # The app was down: the spool replays scrapes 10 minutes old, every instance of the host alike.
    replay = _row(host_last_push=1000.0, last_ok=400.0, last_scrape=400.0, host_last_scrape=400.0)
    assert instance_state(replay, 1000.0, 30.0) == "up"
    assert instance_state(_row(host_last_scrape=990.0), 1000.0, 30.0) == "up"
    assert instance_state(_row(last_ok=900.0, last_scrape=990.0, host_last_scrape=990.0), 1000.0, 30.0) == "down"
    assert instance_state(_row(last_scrape=950.0, host_last_scrape=990.0), 1000.0, 30.0) == "gone"
    # a silent agent is "stale", whatever its scrapes say
    assert instance_state(_row(host_last_push=900.0, last_scrape=800.0, host_last_scrape=900.0), 1000.0, 30.0) == (
        "stale"
    )
