"""Spool bound and order; pusher outcomes: 200 removes, 5xx/401 retry with backoff, 422 dropped."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from agent.pusher import Pusher
from agent.spool import Spool


def _batch(seq: int, pad: int = 0) -> dict:
    return {"seq": seq, "pad": "x" * pad}


def test_spool_survives_restart_in_order(tmp_path: Path) -> None:
    sp = Spool(tmp_path)
    for seq in (5, 6, 7):
        sp.append(seq, _batch(seq))
    again = Spool(tmp_path)
    assert len(again) == 3 and again.max_seq == 7
    got = []
    while (item := again.peek()) is not None:
        got.append(json.loads(item[1])["seq"])
        again.remove(item[0])
    assert got == [5, 6, 7]
    assert list(tmp_path.iterdir()) == []


def test_spool_drops_oldest_only_past_the_bound_and_counts(tmp_path: Path) -> None:
    one = len(json.dumps(_batch(1, 1000), separators=(",", ":")))
    sp = Spool(tmp_path, max_bytes=one * 3)
    for seq in range(1, 4):
        sp.append(seq, _batch(seq, 1000))
    assert len(sp) == 3 and sp.take_dropped() == (0, 0)
    sp.append(4, _batch(4, 1000))
    sp.append(5, _batch(5, 1000))
    assert len(sp) == 3
    assert sp.take_dropped() == (2, 2 * one)
    assert sp.take_dropped() == (0, 0)
    assert sp.dropped_total == 2
    item = sp.peek()
    assert item is not None and json.loads(item[1])["seq"] == 3


class App:
    def __init__(self) -> None:
        self.status = 200
        self.got: list[int] = []

    def handler(self, req: httpx.Request) -> httpx.Response:
        if self.status == -1:
            raise httpx.ConnectError("refused", request=req)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": "nope"})
        assert req.headers["authorization"] == "Bearer T"
        self.got.append(json.loads(req.content)["seq"])
        return httpx.Response(
            200,
            json={
                "accepted": True,
                "commands": [{"id": 1, "kind": "rollout", "instance": "http://v", "payload": {"a": 1}}],
            },
        )


def _pusher(tmp_path: Path, app: App) -> Pusher:
    client = httpx.Client(transport=httpx.MockTransport(app.handler))
    return Pusher("http://app/", "T", client, Spool(tmp_path))


def test_push_in_order_and_commands_returned(tmp_path: Path) -> None:
    app = App()
    p = _pusher(tmp_path, app)
    for s in (1, 2, 3):
        p.spool.append(s, _batch(s))
    res = p.flush(100.0)
    assert res.pushed == 3 and app.got == [1, 2, 3] and len(p.spool) == 0
    assert [c.kind for c in res.commands] == ["rollout"] * 3


def test_outage_keeps_batches_and_backs_off(tmp_path: Path) -> None:
    app = App()
    p = _pusher(tmp_path, app)
    app.status = -1
    p.spool.append(1, _batch(1))
    assert p.flush(100.0).error
    assert p.next_attempt_at == 101.0
    p.spool.append(2, _batch(2))
    assert p.flush(100.5).pushed == 0  # backing off: no attempt
    assert p.flush(101.0).error  # second failure: 2 s
    assert p.next_attempt_at == 103.0
    for i in range(20):
        p.flush(200.0 + i * 100)
    assert p.next_attempt_at - (200.0 + 19 * 100) == 60.0  # capped
    app.status = 200
    assert p.flush(10_000.0).pushed == 2
    assert app.got == [1, 2]


def test_401_is_retried_422_is_dropped_and_reported(tmp_path: Path) -> None:
    app = App()
    p = _pusher(tmp_path, app)
    p.spool.append(1, _batch(1))
    p.spool.append(2, _batch(2))
    app.status = 401
    res = p.flush(100.0)
    assert "401" in (res.error or "") and "--token" in (res.error or "")
    assert len(p.spool) == 2
    app.status = 422
    res = p.flush(1000.0)
    assert len(p.spool) == 0 and p.rejected_total == 2
    ev = p.take_events()
    assert [e.data["seq"] for e in ev] == [1, 2]
    assert p.take_events() == []
    app.status = 503
    p.spool.append(3, _batch(3))
    assert p.flush(2000.0).error and len(p.spool) == 1
