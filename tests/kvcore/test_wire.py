"""The agent's fast serializer equals the contract's to_wire (dataclasses.asdict)."""

from __future__ import annotations

from kvcore.protocol import AgentEvent, PushBatch, RolloutUpdate, Sample, Scrape, to_wire
from kvcore.wire import batch_to_wire


def test_fast_wire_equals_asdict() -> None:
    b = PushBatch(
        agent_id="a",
        host="h",
        seq=3,
        sent_at=1.5,
        agent_version="0.1.0",
        scrapes=[
            Scrape(
                instance="http://v",
                ts=1.0,
                ok=True,
                error=None,
                healthy=True,
                model="m",
                model_root="/r",
                max_model_len=2048,
                version="0.33.0",
                simulated=True,
                types={"vllm:x": "counter"},
                samples=[Sample("vllm:x_total", {"engine": "0"}, 5.0)],
            ),
            Scrape(instance="http://w", ts=1.0, ok=False, error="boom"),
        ],
        host_ts=1.0,
        host_samples=[Sample("kvscope:gpu_count", {}, 0.0)],
        host_types={"kvscope:gpu_count": "gauge"},
        events=[AgentEvent(ts=1.0, kind="note", message="m", instance=None, data={"a": [1, {"b": 2}]})],
        rollout_updates=[RolloutUpdate(rollout_id=4, ts=1.0, state="healthy", message="ok", data={"x": 1})],
    )
    assert batch_to_wire(b) == to_wire(b)
    assert list(batch_to_wire(b)) == list(to_wire(b))
    assert list(batch_to_wire(b)["scrapes"][0]) == list(to_wire(b)["scrapes"][0])
