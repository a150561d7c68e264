"""The instance's own tier size is simulated as a size of its own, added when the agent first
reads it (``cpu_num_chunks`` of ``vllm:kv_offload_config_info``): exact from the next window on
where the bank can know that size's state, left out of the windows until warm where it cannot."""

from __future__ import annotations

import random

import httpx

from agent.fetch import HttpxFetcher
from agent.kvevents.collector import KvEventsCollector
from agent.kvevents.decode import decode_message
from agent.kvevents.tier_bank import TierBank
from agent.kvevents.tier_model import TierModel
from kvcore.protocol import Sample, Scrape
from tests.agent.kvevents.kvstreams import message, removed_map, stored_map

CAPS = [4, 8, 16, 32, 64]


def _requests(rng: random.Random, n: int) -> list[tuple[list[int], list[int]]]:
    docs = [[rng.getrandbits(64) for _ in range(rng.randint(1, 9))] for _ in range(rng.randint(4, 30))]
    out = []
    for _ in range(n):
        doc = docs[min(int(rng.paretovariate(0.8)) - 1, len(docs) - 1)]
        cut = rng.randint(0, len(doc) - 1)
        out.append((list(reversed(doc[:cut])), doc[cut:]))  # (GPU-hit prefix last block first, stored)
    return out


def test_a_size_added_where_the_bank_knows_its_state_loads_what_it_would_have_had_it_run_all_along() -> None:
    rng = random.Random(5)
    exact = approx = 0
    for _ in range(120):
        c = rng.choice([2, 6, 12, 24, 48, 80, 200])
        reqs = _requests(rng, 160)
        whole, added = TierBank([*CAPS, c]), TierBank(CAPS)
        at = whole.capacities.index(c)
        for prefix, stored in reqs[:80]:
            whole.serve(prefix, stored)
            added.serve(prefix, stored)
        got = added.add(c)
        assert got is not None and added.capacities == whole.capacities
        if got:
            exact += 1
            assert added.cold() == set()
            for prefix, stored in reqs[80:]:
                assert added.serve(prefix, stored) == whole.serve(prefix, stored)
        else:
            approx += 1
            assert added.cold() == {c}
            for prefix, stored in reqs[80:]:
                added.serve(prefix, stored)
            tier = added.tiers[at]
            assert (c in added.cold()) == (tier.inserted < c)  # warm once it stored its capacity
    assert exact > 10 and approx > 10  # both kinds were met


def test_a_size_already_there_or_out_of_range_is_not_added() -> None:
    bank = TierBank(CAPS)
    assert bank.add(8) is None and bank.add(0) is None and bank.add(1 << 20) is None
    assert bank.capacities == CAPS
    full = TierBank(range(1, 65))
    assert full.add(100) is None


def _frames(rng: random.Random, n: int, seq0: int = 0) -> list[list[bytes]]:
    docs = [[rng.getrandbits(64) for _ in range(rng.randint(1, 6))] for _ in range(12)]
    frames = []
    for i in range(n):
        doc = docs[min(int(rng.paretovariate(1.0)) - 1, 11)]
        cut = rng.randint(1, len(doc))
        events = [removed_map(doc), stored_map(doc[:cut])]
        if doc[cut:]:
            events.append(stored_map(doc[cut:], parent=doc[cut - 1]))
        frames.append(message(seq0 + i, events))
    return frames


def _points(window) -> dict[int, float]:  # type: ignore[no-untyped-def]
    return {int(c): n for c, n in window.points}


def test_an_exact_size_added_mid_window_takes_the_loads_of_a_size_that_never_evicted() -> None:
    # vLLM publishes kv_offload_config_info only after its first step: the own size comes after
    # the first window served requests, and that window must carry it all the same.
    frames = _frames(random.Random(3), 90)
    own = 100  # above every size that evicted: exact
    whole = TierModel("u", 0.0, max_keys=None, capacities=[*CAPS, own])
    model = TierModel("u", 0.0, max_keys=None, capacities=CAPS)
    for start, end in ((0, 30), (30, 60), (60, 90)):
        for f in frames[start:end]:
            whole.observe(decode_message(f))
            model.observe(decode_message(f))
        if start == 0:
            model.want_capacity(own, 16)  # the scrape said so; applied when the window is taken
        a, b = whole.take_window(float(end)), model.take_window(float(end))
        assert _points(b) == _points(a) and own in _points(b)


def test_a_seeded_size_is_left_out_of_the_window_it_is_added_in_and_until_it_is_warm() -> None:
    frames = _frames(random.Random(3), 90)
    model = TierModel("u", 0.0, max_keys=None, capacities=CAPS)
    for f in frames[:60]:
        model.observe(decode_message(f))
    assert model._ranks[0].bank.tiers[0].failed or model._ranks[0].bank.tiers[0].size() == 4  # 4 evicted
    model.want_capacity(6, 16)  # between two sizes that evicted: seeded, not exact
    first = model.take_window(1.0)
    assert set(_points(first)) == set(CAPS)
    bank = model._ranks[0].bank
    for f in frames[60:75]:
        model.observe(decode_message(f))
    assert bank.tiers[1].capacity == 6 and bank.tiers[1].inserted >= 6  # warm by now ...
    assert 6 not in _points(model.take_window(2.0))  # ... but it was cold when this window began
    for f in frames[75:]:
        model.observe(decode_message(f))
    assert 6 in _points(model.take_window(3.0))  # warm from its start on


def test_a_size_read_before_the_first_event_is_in_the_first_window_already() -> None:
    frames = _frames(random.Random(4), 40)
    whole = TierModel("u", 0.0, max_keys=None, capacities=[*CAPS, 100])
    model = TierModel("u", 0.0, max_keys=None, capacities=CAPS)
    model.want_capacity(100, 16)  # the first scrape comes before the first KV event
    for f in frames:
        whole.observe(decode_message(f))
        model.observe(decode_message(f))
    a, b = whole.take_window(1.0), model.take_window(1.0)
    assert _points(b) == _points(a) and 100 in _points(b)


def test_a_tier_of_other_chunks_than_the_event_blocks_is_not_taken_for_the_own_size() -> None:
    model = TierModel("u", 0.0, max_keys=None, capacities=CAPS)
    model.observe(decode_message(message(0, [stored_map([1, 2, 3])])))  # 16-token blocks
    model.want_capacity(100, 256)  # chunks of 256 tokens: not one block each
    model.take_window(1.0)
    model.observe(decode_message(message(1, [stored_map([4])])))
    assert set(_points(model.take_window(2.0))) == set(CAPS)


def _scrape(labels: dict[str, str], ok: bool = True) -> Scrape:
    return Scrape(
        instance="http://h:8000/",
        ts=0.0,
        ok=ok,
        samples=[Sample(name="vllm:kv_offload_config_info", labels=labels, value=1.0)],
    )


def test_the_collector_takes_the_own_size_from_the_scrape_and_ignores_garbled_labels() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("must not be asked")

    started: list = []
    col = KvEventsCollector(
        ["http://h:8000"],
        HttpxFetcher(httpx.Client(transport=httpx.MockTransport(handler))),
        configs={"http://h:8000": {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:5999"}},
        start=started.append,
    )
    col.windows(0.0)
    model = started[0].model
    for bad in (
        {"cpu_num_chunks": "many", "offload_block_size": "16"},
        {"cpu_num_chunks": "-5", "offload_block_size": "16"},
        {"cpu_num_chunks": str(1 << 50), "offload_block_size": "16"},
        {"offload_block_size": "16"},
    ):
        col.scrapes_seen([_scrape(bad)])
        assert model._wanted is None
    col.scrapes_seen([_scrape({"cpu_num_chunks": "910", "offload_block_size": "16"}, ok=False)])
    assert model._wanted is None  # a failed scrape says nothing
    col.scrapes_seen([_scrape({"cpu_num_chunks": "910", "offload_block_size": "16"})])
    assert model._wanted == (910, 16)
