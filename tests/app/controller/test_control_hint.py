"""Every control page (profiles, apply, A/B, sizing) says how to hand kvscope control of an
instance its agent only watches, and says nothing of the kind for one the agent may restart
(`controlled` in the push) or before any agent of the host pushed; the wire field has a bound."""

from __future__ import annotations

from typing import Any

from kvcore.protocol import PushBatch, to_wire
from kvcore.wire import batch_to_wire
from tests.conftest import make_batch

URL = "http://127.0.0.1:8000"  # make_batch's instance
HOW = "kvscope up -- vllm serve MODEL [ARGS...]"


def _push(client: Any, token: str, seq: int, ts: float, **extra: Any) -> Any:
    batch = make_batch(seq, ts)
    batch.update(extra)
    return client.post("/api/v1/ingest", json=batch, headers={"Authorization": f"Bearer {token}"})


def _pages(client: Any, iid: int) -> dict[str, str]:
    return {
        "profiles": client.get("/profiles").text,
        "apply": client.get(f"/instances/{iid}/apply").text,
        "ab": client.get(f"/instances/{iid}/experiment").text,
        "sizing": client.get(f"/instances/{iid}/sizing").text,
    }


def test_a_watched_instance_gets_the_how_to_hand_control_sentence_on_every_control_page(
    client: Any, token: str, clock: Any
) -> None:
    assert _push(client, token, 1, clock()).status_code == 200  # an agent without a controller
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    for name, html in _pages(client, iid).items():
        assert 'id="control-hint"' in html, name
        assert HOW in html and "kvscope agent --launcher-config agent.toml" in html, name
        assert f"<code>{URL}</code>" in html, name


def test_a_controlled_instance_gets_no_hint(client: Any, token: str, clock: Any) -> None:
    assert _push(client, token, 1, clock(), controlled=[URL]).status_code == 200
    iid = client.get("/api/v1/instances").json()["instances"][0]["id"]
    for name, html in _pages(client, iid).items():
        assert 'id="control-hint"' not in html, name


def test_an_over_long_controlled_list_is_refused_with_a_message(client: Any, token: str, clock: Any) -> None:
    r = _push(client, token, 1, clock(), controlled=[f"http://127.0.0.1:{9000 + i}" for i in range(257)])
    assert r.status_code in (400, 422) and "controlled lists 257 servers; at most 256" in r.text
    r = _push(client, token, 2, clock(), controlled=["http://x\x01"])
    assert r.status_code in (400, 422) and "controlled.0 must be 1-1024 printable characters" in r.text


def test_controlled_is_on_the_wire_only_when_set() -> None:
    b = PushBatch(agent_id="a", host="h", seq=1, sent_at=1.0)
    assert "controlled" not in to_wire(b) and "controlled" not in batch_to_wire(b)
    b.controlled = [URL]
    assert batch_to_wire(b) == to_wire(b) and to_wire(b)["controlled"] == [URL]
