"""The app stops for N pushes and comes back: every sample arrives exactly once, in order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from agent.fetch import StdlibFetcher
from agent.loop import Agent, AgentConfig
from app.derived.series_reader import SeriesQuery, read_series
from app.storage.models import IngestBatch
from app.storage.series_store import list_instances
from tests.agent.fakevllm import FakeVllm
from tests.agent.livesrv import LiveServer


@pytest.fixture
def live(app: Any) -> Iterator[LiveServer]:
    srv = LiveServer(app)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("push_kind", ["stdlib", "httpx"])
def test_outage_every_sample_once_in_order(
    live: LiveServer, token: str, engine: Any, clock: Any, tmp_path: Path, push_kind: str
) -> None:
    fake = FakeVllm()
    # stdlib: what `kvscope agent` uses; its keep-alive connection goes stale when the app stops
    push: Any = StdlibFetcher() if push_kind == "stdlib" else httpx.Client(trust_env=False)
    agent = Agent(
        AgentConfig(["http://vllm:8000"], server=live.url, token=token, host_name="rig1", state_dir=tmp_path / "state"),
        client=fake.client(),
        push_client=push,
    )
    t0 = clock() - 100
    ticks, down_from, down_to = 14, 3, 9  # the app is down for ticks 3..8 (6 pushes)
    max_failures = spooled = 0
    try:
        for i in range(ticks):
            if i == down_from:
                live.stop()
            if i == down_to:
                live.start()
            now = t0 + i
            agent.tick(now)
            res = agent.flush(now)
            if down_from <= i < down_to:
                assert res.pushed == 0
                assert agent.pusher is not None
                max_failures = agent.pusher.failures
                spooled = len(agent.spool)
        assert 2 <= max_failures < down_to - down_from  # backed off: fewer attempts than ticks
        assert spooled == down_to - down_from
        agent.flush(t0 + ticks + 120)  # whatever is left after the backoff
        assert len(agent.spool) == 0
    finally:
        push.close()
        agent.close()

    [inst] = list_instances(engine)
    [series] = read_series(
        engine, SeriesQuery(["vllm:prompt_tokens_total"], t0 - 1, t0 + ticks, instance_id=inst["id"])
    )
    assert series.points == [(round((t0 + i) * 1000) / 1000, fake.prompt_tokens(i + 1)) for i in range(ticks)]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(IngestBatch)).scalar() == ticks


def test_spool_survives_an_agent_restart(live: LiveServer, token: str, engine: Any, clock: Any, tmp_path: Path) -> None:
    fake = FakeVllm()
    state = tmp_path / "state"
    t0 = clock() - 50
    refused = httpx.Client(trust_env=False)
    dead = Agent(
        AgentConfig(["http://vllm:8000"], server="http://127.0.0.1:9", token=token, host_name="rig1", state_dir=state),
        client=fake.client(),
        push_client=refused,
    )
    for i in range(3):
        dead.tick(t0 + i)
        dead.flush(t0 + i)
    dead.close()
    refused.close()
    push = httpx.Client(trust_env=False)
    agent = Agent(
        AgentConfig(["http://vllm:8000"], server=live.url, token=token, host_name="rig1", state_dir=state),
        client=fake.client(),
        push_client=push,
    )
    try:
        assert agent.agent_id == dead.agent_id and len(agent.spool) == 3
        agent.tick(t0 + 3)
        assert agent.flush(t0 + 3).pushed == 4
    finally:
        push.close()
        agent.close()
    [inst] = list_instances(engine)
    [series] = read_series(engine, SeriesQuery(["vllm:prompt_tokens_total"], t0 - 1, t0 + 4, instance_id=inst["id"]))
    assert [v for _t, v in series.points] == [fake.prompt_tokens(i + 1) for i in range(4)]


def test_lost_reply_is_resent_and_stored_once(client: Any, token: str, engine: Any, clock: Any, tmp_path: Path) -> None:
    """The app stores a batch but the reply never reaches the agent: the re-sent batch is a duplicate."""
    lose_reply = {"left": 1}

    def via_app(req: httpx.Request) -> httpx.Response:
        # the app is reached as the test client's host (its Host allow-list refuses 'app')
        headers = {k: v for k, v in req.headers.items() if k.lower() != "host"}
        r = client.post(req.url.path, content=req.content, headers=headers)
        if lose_reply["left"]:
            lose_reply["left"] -= 1
            raise httpx.ReadTimeout("reply lost", request=req)
        return httpx.Response(r.status_code, content=r.content)

    fake = FakeVllm()
    agent = Agent(
        AgentConfig(
            ["http://vllm:8000"], server="http://app", token=token, host_name="rig1", state_dir=tmp_path / "st"
        ),
        client=fake.client(),
        push_client=httpx.Client(transport=httpx.MockTransport(via_app)),
    )
    t0 = clock() - 10
    try:
        agent.tick(t0)
        assert agent.flush(t0).error  # stored by the app, but the agent cannot know
        agent.tick(t0 + 1)
        assert agent.flush(t0 + 5).pushed == 2
    finally:
        agent.close()
    [inst] = list_instances(engine)
    [series] = read_series(engine, SeriesQuery(["vllm:prompt_tokens_total"], t0 - 1, t0 + 2, instance_id=inst["id"]))
    assert [v for _t, v in series.points] == [fake.prompt_tokens(1), fake.prompt_tokens(2)]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(IngestBatch)).scalar() == 2
