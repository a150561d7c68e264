"""The tick and the batch: several servers failing alone, host-source error events, spool loss,
commands to the controller's sink and its updates back, all with time passed in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from agent.host_sources import HostCollector, HostReading
from agent.loop import Agent, AgentConfig
from kvcore.protocol import AgentEvent, Command, RolloutUpdate
from tests.agent.fakevllm import FakeVllm


class FlakySource:
    name = "flaky"

    def __init__(self) -> None:
        self.mode = "ok"

    def read(self, now: float) -> HostReading:
        if self.mode == "raise":
            raise RuntimeError("reader bug")
        r = HostReading()
        r.gauge("kvscope:host_memory_total_bytes", 1.0)
        r.gauge("kvscope:host_memory_available_bytes", None)  # missing: no sample
        if self.mode == "error":
            r.error = "meminfo: Permission denied"
        return r

    def close(self) -> None:
        pass


class Sink:
    def __init__(self) -> None:
        self.got: list[Command] = []
        self.closed = False

    def submit(self, command: Command, now: float) -> None:
        self.got.append(command)

    def drain_updates(self) -> list[RolloutUpdate]:
        return [RolloutUpdate(rollout_id=c.id, ts=1.0, state="preflight") for c in self.got]

    def drain_events(self) -> list[AgentEvent]:
        return [AgentEvent(ts=1.0, kind="rollout", message=f"got {c.id}") for c in self.got]

    def close(self) -> None:
        self.closed = True


def _multi(tmp_path: Path, **kw: Any) -> tuple[Agent, dict[str, FakeVllm]]:
    fakes = {"http://a:8000": FakeVllm(), "http://b:8000": FakeVllm(simulated=True)}

    def route(req: httpx.Request) -> httpx.Response:
        return fakes[f"http://{req.url.host}:{req.url.port}"].handler(req)

    agent = Agent(
        AgentConfig(list(fakes), state_dir=tmp_path / "st", host_name="rig"),
        client=httpx.Client(transport=httpx.MockTransport(route)),
        **kw,
    )
    return agent, fakes


def test_each_server_fails_alone(tmp_path: Path) -> None:
    agent, fakes = _multi(tmp_path)
    fakes["http://a:8000"].mode = "timeout"
    b = agent.build_batch(1000.0)
    a_scrape, b_scrape = b.scrapes
    assert (a_scrape.instance, a_scrape.ok) == ("http://a:8000", False)
    assert (b_scrape.instance, b_scrape.ok, b_scrape.simulated) == ("http://b:8000", True, True)
    assert b.host == "rig" and b.events[0].kind == "agent_start"
    fakes["http://a:8000"].mode = "ok"
    b2 = agent.build_batch(1001.0)
    assert all(s.ok for s in b2.scrapes) and b2.seq > b.seq
    assert [e.kind for e in b2.events] == []  # agent_start only once


def test_host_errors_reported_on_change_only(tmp_path: Path) -> None:
    src = FlakySource()
    coll = HostCollector([src])
    assert coll.read_all(1.0).events == []
    src.mode = "error"
    r = coll.read_all(2.0)
    assert [e.kind for e in r.events] == ["scrape_error"] and [s.name for s in r.samples] == [
        "kvscope:host_memory_total_bytes"
    ]
    assert coll.read_all(3.0).events == []
    src.mode = "raise"
    r = coll.read_all(4.0)
    assert [e.kind for e in r.events] == ["scrape_error"] and "reader bug" in r.events[0].message
    src.mode = "ok"
    assert [e.kind for e in coll.read_all(5.0).events] == ["note"]


def test_spool_loss_is_reported_in_a_later_batch(tmp_path: Path) -> None:
    agent, _ = _multi(tmp_path)
    agent.spool.max_bytes = 1  # every new batch pushes the previous one out
    agent.tick(1000.0)
    agent.tick(1001.0)
    b = agent.tick(1002.0)
    [ev] = [e for e in b.events if e.kind == "spool_dropped"]
    assert ev.data["batches"] == 1 and ev.data["dropped_total"] == 1
    assert len(agent.spool) == 1


def test_commands_reach_the_sink_and_updates_ride_on_the_next_batch(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    def app(req: httpx.Request) -> httpx.Response:
        sent.append(json.loads(req.content))
        cmds = [{"id": 7, "kind": "rollout", "instance": "http://a:8000", "payload": {"profile": "x"}}]
        return httpx.Response(200, json={"accepted": True, "commands": cmds if len(sent) == 1 else []})

    sink = Sink()
    fakes = {"http://a:8000": FakeVllm()}
    agent = Agent(
        AgentConfig(list(fakes), server="http://app", token="T", state_dir=tmp_path / "st"),
        client=fakes["http://a:8000"].client(),
        sink=sink,
        push_client=httpx.Client(transport=httpx.MockTransport(app)),
    )
    agent.tick(1000.0)
    agent.flush(1000.0)
    assert [(c.id, c.payload) for c in sink.got] == [(7, {"profile": "x"})]
    agent.tick(1001.0)
    agent.flush(1001.0)
    assert sent[1]["rollout_updates"][0]["rollout_id"] == 7
    assert any(e["kind"] == "rollout" for e in sent[1]["events"])
    agent.close()
    assert sink.closed


def test_once_without_server_has_no_pusher(tmp_path: Path) -> None:
    agent, _ = _multi(tmp_path)
    assert agent.pusher is None
    agent.tick(1.0)
    assert agent.flush(1.0).pushed == 0


def test_servers_are_read_concurrently(tmp_path: Path) -> None:
    import threading

    b_asked = threading.Event()
    fake = FakeVllm()

    def route(req: httpx.Request) -> httpx.Response:
        if req.url.host == "b":
            b_asked.set()
        elif req.url.path == "/health" and not b_asked.wait(10):
            # read one after the other, a would be asked before b ever is: a hang
            raise httpx.ReadTimeout("a was read before b", request=req)
        return fake.handler(req)

    agent = Agent(
        AgentConfig(["http://a:8000", "http://b:8000"], state_dir=tmp_path / "st"),
        client=httpx.Client(transport=httpx.MockTransport(route)),
    )
    try:
        batch = agent.build_batch(1000.0)
    finally:
        agent.close()
    assert [(s.instance, s.ok) for s in batch.scrapes] == [("http://a:8000", True), ("http://b:8000", True)]


def test_seq_never_goes_back_across_restarts_even_with_the_clock_set_back(tmp_path: Path) -> None:
    agent, _ = _multi(tmp_path)
    first = agent.tick(2000.0).seq
    agent.spool.remove(agent.spool.peek()[0])  # type: ignore[index]  # as if pushed
    agent.close()
    again, _ = _multi(tmp_path)
    assert again.tick(1000.0).seq > first  # clock 1000 s earlier, empty spool
    again.close()


def test_an_unwritable_spool_loses_batches_and_says_so(tmp_path: Path, monkeypatch: Any) -> None:
    agent, _ = _multi(tmp_path)

    def full(_seq: int, _batch: Any) -> None:
        raise OSError(28, "No space left on device")

    real = agent.spool.append
    monkeypatch.setattr(agent.spool, "append", full)
    agent.tick(1000.0)
    agent.tick(1001.0)
    monkeypatch.setattr(agent.spool, "append", real)
    b = agent.tick(1002.0)
    [ev] = [e for e in b.events if e.kind == "spool_dropped"]
    assert ev.data == {"batches": 2, "reason": "write_failed"} and "No space left" in ev.message
    assert [e.kind for e in b.events].count("agent_start") == 1  # events of lost batches carried over
    assert len(agent.spool) == 1
    assert not [e for e in agent.tick(1003.0).events if e.kind == "spool_dropped"]  # told once
