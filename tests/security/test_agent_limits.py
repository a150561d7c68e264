"""Issue 29, agent limits: instances per host, commands scoped to the token's host, capped strings
of the push wire contract, the agent's token off the command line, and huge numbers at the API
boundary. Each test failed on main f60e474."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import func, select

from app.storage.models import Instance
from tests.conftest import make_batch

AUTH = "Authorization"
CAP = 3  # instances per host, in these tests


@pytest.fixture
def settings(settings: Any) -> Any:
    return settings.model_copy(update={"ingest": settings.ingest.model_copy(update={"max_instances_per_host": CAP})})


def _push(client: Any, token: str, batch: dict[str, Any]) -> Any:
    return client.post("/api/v1/ingest", content=json.dumps(batch), headers={AUTH: f"Bearer {token}"})


def _instances(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Instance)).scalar_one())


def _batch(seq: int, ts: float, urls: list[str], **kw: Any) -> dict[str, Any]:
    b = make_batch(seq, ts, **kw)
    one = b["scrapes"][0]
    b["scrapes"] = [{**one, "instance": u} for u in urls]
    return b


# ---------------------------------------------------------------- instances per host


def test_a_push_creating_instances_past_the_per_host_cap_is_refused_and_known_ones_keep_pushing(
    client: Any, token: str, engine: Any, clock: Any
) -> None:
    urls = [f"http://127.0.0.1:{8000 + i}" for i in range(CAP + 1)]
    assert _push(client, token, _batch(1, clock(), urls[:CAP])).status_code == 200
    r = _push(client, token, _batch(2, clock() + 1, urls))  # one new: 4 > 3
    assert r.status_code == 422
    assert f"cap is {CAP} instances per host" in r.json()["error"]
    assert "KVSCOPE_MAX_INSTANCES_PER_HOST" in r.json()["error"]
    assert _instances(engine) == CAP
    # an event naming a new instance would create one too
    ev = _batch(3, clock() + 2, urls[:1])
    ev["events"] = [{"ts": clock() + 2, "kind": "note", "message": "hi", "instance": urls[CAP]}]
    assert _push(client, token, ev).status_code == 422
    assert _instances(engine) == CAP
    assert _push(client, token, _batch(4, clock() + 3, urls[:CAP])).status_code == 200  # seq 2 and 3 unused


def test_a_push_naming_thousands_of_instances_is_refused_before_any_database_work(
    client: Any, token: str, engine: Any, clock: Any
) -> None:
    urls = [f"http://10.0.{i // 250}.{i % 250}:8000" for i in range(5000)]
    r = _push(client, token, _batch(1, clock(), urls))
    assert r.status_code == 422 and "instances per host" in r.json()["error"]
    assert _instances(engine) == 0


# ---------------------------------------------------------------- commands scoped to the host


def test_another_hosts_agent_sending_the_same_agent_id_does_not_take_this_hosts_rollouts(
    client: Any, token: str, engine: Any, clock: Any
) -> None:
    from app.storage.tokens import create_token

    assert _push(client, token, make_batch(1, clock(), agent_id="agent-1")).status_code == 200
    assert client.post("/api/v1/profiles", json={"name": "fp8", "spec": {"kv_cache_dtype": "fp8"}}).status_code == 201
    iid = int(client.get("/api/v1/instances").json()["instances"][0]["id"])
    r = client.post("/api/v1/rollouts", json={"instance": iid, "profile": "fp8", "requested_by": "test"})
    assert r.status_code == 201, r.text
    rid = int(r.json()["id"])
    rig2 = create_token(engine, "rig2-agent", clock(), host="rig2")
    # rig2's agent pushes as "agent-1" (rig1's agent id) with its own instances: its reply is empty
    other = make_batch(1, clock(), agent_id="agent-1", host="rig2", instance="http://10.9.9.9:8000")
    got = _push(client, rig2, other)
    assert got.status_code == 200 and got.json()["commands"] == []
    poll = client.post(
        "/api/v1/commands?wait=0", json={"agent_id": "agent-1", "host": "rig1"}, headers={AUTH: f"Bearer {token}"}
    )
    assert poll.status_code == 200
    assert [c["id"] for c in poll.json()["commands"]] == [rid]
    # and rig2's token may not poll rig1
    assert (
        client.post(
            "/api/v1/commands?wait=0", json={"agent_id": "agent-1", "host": "rig1"}, headers={AUTH: f"Bearer {rig2}"}
        ).status_code
        == 403
    )


# ---------------------------------------------------------------- strings of the push


def test_a_megabyte_scrape_error_is_truncated_with_a_marker_and_the_samples_kept(clock: Any) -> None:
    from app.ingest.parse import MAX_SCRAPE_ERROR, TRUNCATED, parse_batch

    b = make_batch(1, clock())
    b["scrapes"][0]["error"] = "x" * 1_000_000
    b["rollout_updates"] = [{"rollout_id": 1, "ts": clock(), "state": "healthy", "message": "m" * 1_000_000}]
    batch = parse_batch(json.dumps(b).encode(), clock(), max_future_skew_s=300, max_past_age_s=86400)
    err = batch.scrapes[0].error
    assert err is not None and len(err) == MAX_SCRAPE_ERROR and err.endswith(TRUNCATED)
    assert len(batch.rollout_updates[0].message) <= 10_000
    assert batch.rollout_updates[0].message.endswith(TRUNCATED)
    assert len(batch.scrapes[0].samples) == 1


@pytest.mark.parametrize(
    ("where", "fragment"),
    [("types", "scrapes.0.types names a family over"), ("reuse", "reuse.0.instance must be")],
)
def test_unbounded_strings_of_the_push_are_refused_with_422(
    client: Any, token: str, clock: Any, where: str, fragment: str
) -> None:
    b = make_batch(1, clock())
    if where == "types":
        b["scrapes"][0]["types"] = {"v" * 100_000: "counter"}
    else:
        b["reuse"] = [{"instance": "u" * 100_000, "start": clock() - 1, "end": clock()}]
    r = _push(client, token, b)
    assert r.status_code == 422 and fragment in r.json()["error"]


# ---------------------------------------------------------------- the agent's token off the command line


def _agent_args(argv: list[str]) -> Any:
    import argparse

    from agent import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["agent", *argv])


def test_the_agent_reads_its_token_from_a_file_or_the_environment_and_warns_about_token_on_the_command_line(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent.cli import agent_token

    monkeypatch.delenv("KVSCOPE_AGENT_TOKEN", raising=False)
    f = tmp_path / "token"
    f.write_text("kvs_secret\n")
    assert agent_token(_agent_args(["--token-file", str(f)])) == "kvs_secret"
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("KVSCOPE_AGENT_TOKEN", "from-env")
    assert agent_token(_agent_args([])) == "from-env"
    assert capsys.readouterr().err == ""
    assert agent_token(_agent_args(["--token", "on-cli"])) == "on-cli"  # still works
    err = capsys.readouterr().err
    assert "visible" in err and "ps" in err and err.count("\n") == 1


# ---------------------------------------------------------------- huge numbers at the API boundary


def _an_instance(client: Any, token: str, clock: Any) -> int:
    assert _push(client, token, make_batch(1, clock())).status_code == 200
    return int(client.get("/api/v1/instances").json()["instances"][0]["id"])


@pytest.mark.parametrize("start", ["-1e308", "1e308", "-1"])
def test_a_series_range_outside_plausible_unix_times_is_a_400_with_a_message(
    client: Any, token: str, clock: Any, start: str
) -> None:
    iid = _an_instance(client, token, clock)
    r = client.get(f"/api/v1/series?instance={iid}&metric=vllm:prompt_tokens_total&start={start}")
    assert r.status_code == 400 and "Unix time in seconds" in r.text
    r = client.get(f"/api/v1/events?start={start}")
    assert r.status_code == 422


@pytest.mark.parametrize("raw", ["1" + "0" * 30, "1e308", "-5", "true"])
def test_a_rollout_for_an_instance_id_out_of_range_is_a_422_with_a_message(
    client: Any, token: str, clock: Any, raw: str
) -> None:
    _an_instance(client, token, clock)
    body = '{"instance": ' + raw + ', "profile": "fp8"}'
    r = client.post("/api/v1/rollouts", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "instance must be an instance id" in r.text


@pytest.mark.parametrize("raw", ["1" + "0" * 30, "1e308", "0", "1.5"])
def test_a_silence_for_an_instance_id_out_of_range_is_a_400_with_a_message(client: Any, raw: str) -> None:
    body = '{"minutes": 60, "instance": ' + raw + "}"
    r = client.post("/api/v1/alerts/silences", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "instance must be an id" in r.text


@pytest.mark.parametrize("raw", ["1" + "0" * 400, "1e400", "-1"])
def test_a_sizing_profile_of_an_absurd_size_is_a_422_with_a_message(
    client: Any, token: str, clock: Any, raw: str
) -> None:
    iid = _an_instance(client, token, clock)
    body = '{"offload_gib": ' + raw + "}"
    r = client.post(
        f"/api/v1/instances/{iid}/sizing/profile", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422 and "offload_gib must be > 0" in r.text
