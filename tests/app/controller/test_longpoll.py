"""The command long-poll: POST /api/v1/commands?wait=S on the app, the agent's poll thread.

No test asserts on a duration: a held poll is seen holding (the app's count of waiting polls),
then released by creating a rollout; a thread that must end is joined and checked dead.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.commands_poll import CommandPoller, PollConnection
from agent.fetch import HttpxFetcher, StdlibFetcher
from agent.loop import Agent, AgentConfig
from app.ingest.commands import poll_state
from kvcore.protocol import AgentEvent, Command, RolloutUpdate
from tests.agent.fakevllm import FakeVllm
from tests.agent.livesrv import LiveServer
from tests.conftest import api_token, make_batch
from tests.waits import wait_until

AUTH = "Authorization"
INSTANCE = "http://127.0.0.1:8000"
BOUND_S = 15.0  # generous bound on waits for threads (the machine is shared); never a measurement


class Sink:
    """A CommandSink that records, idempotent by id like the controller."""

    def __init__(self) -> None:
        self.got: list[Command] = []
        self.arrived = threading.Event()
        self.closed = False

    def submit(self, command: Command, now: float) -> None:
        if all(c.id != command.id for c in self.got):
            self.got.append(command)
        self.arrived.set()

    def drain_updates(self) -> list[RolloutUpdate]:
        return []

    def drain_events(self) -> list[AgentEvent]:
        return []

    def close(self) -> None:
        self.closed = True


def until(cond: Callable[[], bool], what: str) -> None:
    wait_until(cond, what, timeout=BOUND_S, interval=0.01)


def _push(client: Any, token: str, seq: int, ts: float, agent_id: str = "agent-1") -> dict[str, Any]:
    r = client.post("/api/v1/ingest", json=make_batch(seq, ts, agent_id=agent_id), headers={AUTH: f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _setup(client: Any, token: str, clock: Any) -> int:
    """A known host rig1 with one instance, and a profile fp8; returns the instance id."""
    _push(client, token, 1, clock())
    r = client.post("/api/v1/profiles", json={"name": "fp8", "spec": {"kv_cache_dtype": "fp8"}})
    assert r.status_code == 201, r.text
    return int(client.get("/api/v1/instances").json()["instances"][0]["id"])


def _rollout(client: Any, iid: int) -> int:
    r = client.post("/api/v1/rollouts", json={"instance": iid, "profile": "fp8", "requested_by": "test"})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _poll(client: Any, token: str | None, wait: Any = 0, **body: Any) -> Any:
    payload = {"agent_id": "agent-1", "host": "rig1", **body}
    headers = {AUTH: f"Bearer {token}" if token else ""}  # "" drops the client's own API token
    return client.post(f"/api/v1/commands?wait={wait}", json=payload, headers=headers)


# ---------------------------------------------------------------- the endpoint
def test_auth_and_bad_requests_answer_4xx_with_a_message(client: Any, token: str, clock: Any) -> None:
    assert _poll(client, None).status_code == 401
    assert _poll(client, "not-a-token").status_code == 401
    assert _poll(client, token).status_code == 409  # no push yet: host unknown
    assert "first push" in _poll(client, token).json()["error"]
    _setup(client, token, clock)
    assert _poll(client, token, wait="soon").status_code == 422
    assert _poll(client, token, wait=-1).status_code == 422
    assert _poll(client, token, wait="nan").status_code == 422
    assert _poll(client, token, agent_id="").status_code == 422
    assert _poll(client, token, host=7).status_code == 422
    assert _poll(client, token, known="1,2").status_code == 422
    assert _poll(client, token, known=[1, "x"]).status_code == 422
    assert _poll(client, token, host="elsewhere").status_code == 403  # the token is bound to rig1
    h = {AUTH: f"Bearer {token}"}
    bad = client.post("/api/v1/commands", content=b"{nope", headers=h)
    assert bad.status_code == 400 and "error" in bad.json()
    assert client.post("/api/v1/commands", content=b"[]", headers=h).status_code == 422
    big = client.post("/api/v1/commands", content=b" " * 70_000, headers=h)
    assert big.status_code == 413
    ok = _poll(client, token)  # wait=0: answers at once
    assert ok.status_code == 200 and ok.json() == {"commands": []}


def test_a_held_poll_is_released_by_a_new_rollout(app: Any, client: Any, token: str, clock: Any) -> None:
    iid = _setup(client, token, clock)
    state = poll_state(app.state.ctx)
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(r=_poll(client, token, wait=30)), daemon=True)
    t.start()
    until(lambda: state.waiting == 1, "the poll to hold")
    assert t.is_alive() and "r" not in out  # nothing to hand: it holds
    rid = _rollout(client, iid)
    t.join(BOUND_S)
    assert not t.is_alive(), "the held poll was not released by the rollout"
    reply = out["r"]
    assert reply.status_code == 200
    [cmd] = reply.json()["commands"]
    assert cmd["id"] == rid and cmd["kind"] == "rollout" and cmd["instance"] == INSTANCE
    assert cmd["payload"]["argv"] == ["--kv-cache-dtype", "fp8"]
    got = client.get(f"/api/v1/rollouts/{rid}").json()
    assert got["state"] == "claimed" and got["claimed_by"] == "agent-1"
    assert state.waiting == 0 and state.answered == 1
    # Re-handed to the same agent (a lost answer loses nothing) unless the agent says it holds it ...
    assert [c["id"] for c in _poll(client, token).json()["commands"]] == [rid]
    assert _poll(client, token, known=[rid]).json()["commands"] == []
    # ... and the push reply hands the same command (same providers): the sink dedups by id.
    assert [c["id"] for c in _push(client, token, 2, clock.advance(1))["commands"]] == [rid]


def test_two_pollers_one_claim(app: Any, client: Any, token: str, clock: Any) -> None:
    iid = _setup(client, token, clock)
    state = poll_state(app.state.ctx)
    replies: dict[str, Any] = {}

    def poll(agent_id: str) -> None:
        replies[agent_id] = _poll(client, token, wait=4, agent_id=agent_id)

    threads = [threading.Thread(target=poll, args=(a,), daemon=True) for a in ("agent-1", "agent-2")]
    for t in threads:
        t.start()
    until(lambda: state.waiting == 2, "both polls to hold")
    rid = _rollout(client, iid)
    for t in threads:
        t.join(BOUND_S)
    assert not any(t.is_alive() for t in threads)
    handed = {a: [c["id"] for c in r.json()["commands"]] for a, r in replies.items()}
    assert sorted(handed.values()) == [[], [rid]], handed
    winner = next(a for a, ids in handed.items() if ids)
    loser = "agent-2" if winner == "agent-1" else "agent-1"
    assert client.get(f"/api/v1/rollouts/{rid}").json()["claimed_by"] == winner
    # The loser gets it neither by poll nor by push.
    assert _poll(client, token, agent_id=loser).json()["commands"] == []
    assert _push(client, token, 2, clock.advance(1), agent_id=loser)["commands"] == []


# ---------------------------------------------------------------- the agent's thread
@pytest.fixture
def live(app: Any) -> Iterator[LiveServer]:
    srv = LiveServer(app)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_agent_thread_delivers_a_command_without_any_push(
    app: Any, live: LiveServer, token: str, clock: Any, tmp_path: Path
) -> None:
    c = httpx.Client(base_url=live.url, timeout=10, headers={AUTH: "Bearer " + api_token(app.state.ctx.engine)})
    try:
        iid = _setup(c, token, clock)
        state_dir = tmp_path / "agent"
        state_dir.mkdir()
        (state_dir / "agent_id").write_text("agent-1\n")
        sink = Sink()
        agent = Agent(
            AgentConfig([INSTANCE], server=live.url, token=token, state_dir=state_dir, host_name="rig1"),
            client=httpx.Client(),
            sink=sink,
            push_client=StdlibFetcher(),
        )
        poller = agent.start_command_poll()
        assert poller is not None and isinstance(poller.http, PollConnection)
        state = poll_state(app.state.ctx)
        try:
            until(lambda: state.waiting == 1, "the agent's poll to hold")
            rid = _rollout(c, iid)
            assert sink.arrived.wait(BOUND_S), "the command never reached the sink"
            assert [(x.id, x.kind) for x in sink.got] == [(rid, "rollout")]
            assert agent.pusher is not None and agent.pusher.pushed_total == 0  # no push carried it
            assert c.get(f"/api/v1/rollouts/{rid}").json()["claimed_by"] == "agent-1"
            until(lambda: state.waiting == 1, "the next poll (sent with known=[rid]) to hold")
            assert poller.known() == [rid] and len(sink.got) == 1
        finally:
            agent.stop_command_poll()
        # The held request is cut, not waited for (wait is 10 s): the thread is gone ...
        assert not poller.alive
        # ... and the app sees the agent leave and stops holding.
        until(lambda: state.waiting == 0, "the app to notice the poll went away")
        agent.close()
    finally:
        c.close()


def test_agent_run_starts_the_poll_with_the_sink_and_its_stop_cuts_it(
    app: Any, live: LiveServer, token: str, clock: Any, tmp_path: Path
) -> None:
    fake = FakeVllm()
    sink = Sink()
    # wait 30 s: a poll that were not cut on stop would outlive the join bound below
    agent = Agent(
        AgentConfig(
            ["http://vllm:8000"],
            server=live.url,
            token=token,
            state_dir=tmp_path / "st",
            host_name="rig1",
            interval_s=0.2,
            command_poll_wait_s=30.0,
        ),
        client=fake.client(),
        sink=sink,
        push_client=StdlibFetcher(),
    )
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop, clock), daemon=True)
    c = httpx.Client(base_url=live.url, timeout=10, headers={AUTH: "Bearer " + api_token(app.state.ctx.engine)})
    try:
        runner.start()
        # the poll starts before the first push (409: host unknown); that push cuts its backoff short
        until(lambda: bool(c.get("/api/v1/instances").json()["instances"]), "the agent's first push")
        until(lambda: poll_state(app.state.ctx).waiting == 1, "the agent's poll to hold")
        assert c.post("/api/v1/profiles", json={"name": "fp8", "spec": {"kv_cache_dtype": "fp8"}}).status_code == 201
        rid = _rollout(c, int(c.get("/api/v1/instances").json()["instances"][0]["id"]))
        assert sink.arrived.wait(BOUND_S)
        assert [x.id for x in sink.got] == [rid]
    finally:
        stop.set()
        runner.join(BOUND_S)
        c.close()
    assert not runner.is_alive() and agent.poller is not None and not agent.poller.alive
    assert sink.closed


def test_no_command_poll_flag(tmp_path: Path) -> None:
    import argparse

    from agent.cli import build_agent, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    base = ["agent", "--no-gpu", "--state-dir", str(tmp_path), "--vllm-url", "http://127.0.0.1:9"]
    for extra, expected in (([], True), (["--no-command-poll"], False)):
        a = build_agent(parser.parse_args(base + extra), server="http://app", token="T")
        try:
            assert a.config.command_poll is expected
        finally:
            a.close()


def _mock_poller(handler: Callable[[httpx.Request], httpx.Response], sink: Sink, **kw: Any) -> CommandPoller:
    http = HttpxFetcher(httpx.Client(transport=httpx.MockTransport(handler)))
    return CommandPoller("http://app", "T", sink, "agent-1", "rig1", client=http, **kw)


def test_an_app_without_the_endpoint_stops_the_thread_and_push_replies_still_work(tmp_path: Path) -> None:
    asked: list[str] = []
    cmd = {"id": 9, "kind": "rollout", "instance": INSTANCE, "payload": {}}

    def old_app(req: httpx.Request) -> httpx.Response:
        asked.append(req.url.path)
        if req.url.path == "/api/v1/ingest":
            return httpx.Response(200, json={"accepted": True, "commands": [cmd]})
        return httpx.Response(404, json={"detail": "Not Found"})

    sink = Sink()
    agent = Agent(
        AgentConfig([INSTANCE], server="http://app", token="T", state_dir=tmp_path / "st"),
        client=httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(503))),
        sink=sink,
        push_client=httpx.Client(transport=httpx.MockTransport(old_app)),
    )
    poller = agent.start_command_poll()
    assert poller is not None
    until(lambda: not poller.alive, "the poll thread to give up on a 404")
    assert poller.unsupported and asked == ["/api/v1/commands"]  # asked once, never again
    agent.tick(1000.0)
    agent.flush(1000.0)
    assert [c.id for c in sink.got] == [9]
    agent.stop_command_poll()
    agent.close()


def test_errors_back_off_and_a_push_cuts_the_backoff_short() -> None:
    answers = [httpx.Response(500, text="boom"), httpx.Response(409, json={"error": "host not known yet"})]
    seen: list[dict[str, Any]] = []
    cmd = {"id": 3, "kind": "rollout", "instance": INSTANCE, "payload": {"x": 1}}
    gate = threading.Event()

    def app(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content))
        if answers:
            return answers.pop(0)
        if not seen[-1]["known"]:
            return httpx.Response(200, json={"commands": [cmd, {"id": "junk"}, "junk"]})
        gate.wait(BOUND_S)  # a held poll, until the test ends
        return httpx.Response(200, json={"commands": []})

    sink = Sink()
    # a backoff far longer than any bound below: only nudge() can end it in time
    poller = _mock_poller(app, sink, backoff_min_s=0.001, backoff_max_s=3600.0, wait_s=5.0)
    assert poller.poll_once().status == "error" and poller.failures == 1
    poller.backoff_min_s = 3600.0
    poller.start()
    try:
        until(lambda: poller.failures == 2, "the 409")
        assert not sink.got
        poller.nudge()  # the agent's push went through
        assert sink.arrived.wait(BOUND_S)
        assert [(c.id, c.payload) for c in sink.got] == [(3, {"x": 1})]
        until(lambda: len(seen) == 4, "the next poll, holding")
        assert seen[-1] == {"agent_id": "agent-1", "host": "rig1", "known": [3]}
        assert poller.failures == 0 and poller.last_error is None
    finally:
        gate.set()
        poller.stop()
    assert not poller.alive
