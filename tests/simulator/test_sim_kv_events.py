"""The simulator's KV events (simulated): vLLM's frames from the simulated prefix cache, and the
curve they give against the simulator's own CPU tier."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from agent.kvevents.decode import Batch, Cleared, Removed, Stored
from agent.kvevents.subscriber import EventSource, Subscriber
from agent.kvevents.tier_model import TierModel
from simulator.kv_events import KvEventsConfigError, SimKvEventPublisher, parse_config
from tests.agent.kvevents.workloads import WORKLOADS
from tests.simulator.simdrive import EventRecorder, app, client, doc_ids, engine, run, serve_closed_loop
from tests.waits import wait_until

MASK = (1 << 64) - 1
# a dense 4B model whose GPU KV pool is capped at 1 GiB (455 blocks of 16 tokens), as in the demo
BASE = ("--profile", "rtx4070-qwen3-4b", "--kv-cache-memory-bytes", "1GiB", "--max-model-len", "6144")


def recorded_run(e, prompts: list[list[int]]) -> list:
    """Serve the prompts on a tierless engine, recording its KV events as vLLM publishes them
    (one BlockStored per run of a request's blocks, with the parent hash)."""
    out: list = []

    def listener(kind: str, h: bytes | None, parent: bytes | None) -> None:
        hh = int.from_bytes(h, "big") & MASK if h else 0
        if kind == "stored":
            p = int.from_bytes(parent, "big") & MASK if parent else None
            last = out[-1] if out else None
            if p is not None and isinstance(last, Stored) and last.hashes[-1] == p:
                out[-1] = Stored((*last.hashes, hh), last.parent, last.block_size, "GPU", 0)
                return
            out.append(Stored((hh,), p, e.cfg.block_size, "GPU", 0))
        elif kind == "removed":
            out.append(Removed((hh,), "GPU"))
        else:
            out.append(Cleared())

    e.pool.listener = listener
    for ids in prompts:
        assert run(e, ids, 2).ext_tokens == 0
    return out


SIZES_GIB = (0.5, 1, 2, 4)


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_the_prediction_from_a_tierless_run_matches_the_simulated_tier_at_every_size(workload):
    """Item 1's accuracy targets (simulated): the event stream of a run without a tier predicts what
    a 0.5/1/2/4 GiB tier reloads on the same workload, within 1 % of the prompt tokens and, where
    the tier reloads >= 5 % of them, within 15 % of what it reloaded."""
    prompts = WORKLOADS[workload]()
    e = engine(*BASE)
    events = recorded_run(e, prompts)
    chunk = e.cfg.bytes_per_token * e.cfg.block_size
    caps = [int(g * 2**30 // chunk) for g in SIZES_GIB]  # vLLM: cpu_bytes_to_use // bytes per chunk
    model = TierModel("sim", now=0.0, max_keys=None, capacities=caps)
    model.observe(Batch(b"", 0, 0.0, 0, events))
    points = {int(c): n for c, n in model.take_window(1.0).points}
    prompt = sum(len(p) for p in prompts)
    big = 0
    for gib, cap in zip(SIZES_GIB, caps, strict=True):
        tier = engine(*BASE, "--kv-offloading-size", str(gib))
        measured = sum(run(tier, ids, 2).ext_tokens for ids in prompts)
        predicted = points[cap] * e.cfg.block_size
        assert abs(predicted - measured) <= 0.01 * prompt, (gib, predicted, measured, prompt)
        if measured >= 0.05 * prompt:
            big += 1
            assert abs(predicted - measured) <= 0.15 * measured, (gib, predicted, measured)
    assert big >= 1  # the workload does exercise a tier


def demo_prompts(n: int) -> list[list[int]]:
    """The dense demo server's traffic (kvscope demo: kvscope.traffic's mix over 8 documents of
    1,600 words, system prompts and unique prompts), as the simulator tokenizes it."""
    from kvscope.traffic import Mix, Traffic
    from simulator.tokenizer import encode

    t = Traffic("http://sim", "qwen3-4b", mix=Mix(documents=8, document_words=1600), seed=0)
    return [encode(t.next_prompt()[1]) for _ in range(n)]


# the demo's dense server: a 1 GiB GPU pool, --max-model-len 4096 (kvscope/demo.py's profile)
DEMO = ("--profile", "rtx4070-qwen3-4b", "--kv-cache-memory-bytes", "1GiB", "--max-model-len", "4096")


@pytest.mark.parametrize("gib", [2, 4])
def test_under_the_demos_concurrency_a_tiers_own_stream_predicts_what_it_reloads(gib):
    """Issue 27: in a fresh demo the curve at the tier's current 2 GiB predicted 12 % fewer reloads
    than the tier measured. The demo's three clients send in step, so requests for one document
    arrive together; one loads it from the tier and, since vLLM caches loaded blocks only when the
    load completes, the next one misses them on the GPU and loads them too (both counted as
    external_kv_transfer), announcing a second copy of each block. Served that way (simulated), the
    tier's own KV events predict its reloads within the issue's targets."""
    prompts = demo_prompts(500)
    e = engine(*DEMO, "--kv-offloading-size", str(gib), "--kv-offloading-backend", "native")
    recorder = EventRecorder(e)
    served = serve_closed_loop(e, prompts, workers=3, interval=1.5, max_tokens=16)
    assert len(served) == len(prompts) and all(r.error is None for r in served)
    arrivals = sorted(r.arrival for r in served)
    assert sum(1 for a, b in itertools.pairwise(arrivals) if b - a < 1e-6) > len(served) // 2  # in step
    assert e.conn is not None
    cap = e.conn.cpu.capacity
    model = TierModel("sim", now=0.0, max_keys=None, capacities=[cap])
    for batch in recorder.batches():
        model.observe(batch)
    window = model.take_window(1.0)
    predicted = {int(c): n for c, n in window.points}[cap] * e.cfg.block_size
    measured = sum(r.ext_tokens for r in served)
    prompt = sum(len(p) for p in prompts)
    assert measured >= 0.05 * prompt  # the tier does reload
    assert abs(predicted - measured) <= 0.01 * prompt, (gib, predicted, measured, prompt)
    assert abs(predicted - measured) <= 0.15 * measured, (gib, predicted, measured)


@pytest.mark.parametrize(
    "text, words",
    [
        ("{", "not JSON"),
        ("[1]", "JSON object"),
        ('{"enable_kv_cache_events": true, "publisher": "kafka"}', "Unknown event publisher"),
        ('{"enable_kv_cache_events": true, "endpoint": 5}', "endpoint must be a string"),
        ('{"enable_kv_cache_events": true, "buffer_steps": "x"}', "kv-events-config"),
        ('{"enable_kv_cache_events": true, "buffer_steps": 0}', "bounded"),
        ('{"enable_kv_cache_events": true, "sim_encoding": "xml"}', "sim_encoding"),
    ],
)
def test_a_bad_kv_events_config_is_refused_with_a_reason(text, words):
    with pytest.raises(KvEventsConfigError, match=words):
        parse_config(text)


def test_config_defaults_follow_vllm():
    cfg = parse_config('{"enable_kv_cache_events": true}')
    assert cfg["publisher"] == "zmq" and cfg["endpoint"] == "tcp://*:5557" and cfg["topic"] == ""
    assert parse_config("{}")["publisher"] == "null"


@pytest.mark.parametrize("encoding", ["maps", "arrays"])
def test_the_simulator_publishes_its_cache_changes_as_vllm_frames(encoding):
    cfg = parse_config(
        json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*", "sim_encoding": encoding})
    )
    e = engine(*BASE)
    pub = SimKvEventPublisher(cfg, e.cfg.block_size)
    sub = Subscriber("sim", [EventSource(endpoint=pub.endpoint, bind=False)], TierModel("sim", 0.0, max_keys=None))
    sub.start()
    try:
        assert sub.ready.wait(5)
        time.sleep(0.3)  # SUB joins late
        e.pool.listener = pub.record
        docs = [doc_ids(i, 1500) for i in range(3)]
        for n in range(12):
            run(e, docs[n % 3] + doc_ids(500 + n, 20), 2)
        got = []

        def referenced() -> bool:
            w = sub.take_window(1.0)
            if w is not None:
                got.append(w)
            return sum(w.references for w in got) >= 3 * 1500 // 16

        wait_until(referenced, "the blocks' references in the subscriber's windows", timeout=10.0, interval=0.1)
        assert sum(w.lost for w in got) == 0 and sum(w.garbage for w in got) == 0
        assert {w.block_size for w in got} == {16}
    finally:
        sub.stop()
        pub.close()
    assert pub.sources()["0"]["endpoint"] == pub.endpoint


def test_kv_event_sources_answers_the_config_or_nothing():
    import asyncio

    async def ask(a) -> dict:
        async with client(a) as c:
            r = await c.get("/kv_event_sources")
            assert r.status_code == 200
            return r.json()

    assert asyncio.run(ask(app(*BASE))) == {}
    sources = {"0": {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557", "topic": "kv"}}
    assert asyncio.run(ask(app(*BASE, kv_event_sources=sources))) == sources
