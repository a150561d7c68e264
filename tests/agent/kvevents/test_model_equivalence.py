"""The fast tier model gives exactly the reference model's windows (tests/agent/kvevents/reference_model.py).

Every speed-up of agent/kvevents/ (tier_model, tier_bank, reuse, pool_model) must leave every
figure of every window as it was: points of every size, ARC points, the stack histogram, the
GPU pool's eviction distances, the counters, the tracked keys and the sampling rate, and the
optimal-eviction bound's access log. Checked on random streams (shared prefixes, GPU evictions,
chunked prefills, epochs, duplicates, restarts, backlogs, hybrid groups, DP ranks, tiny and
default tier sizes, SHARDS shrinking) and on the recorded and workload streams.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from agent.kvevents.decode import Batch, Cleared, Event, Removed, Stored, decode_message
from agent.kvevents.pool_model import LeverModel
from agent.kvevents.tier_model import TierModel
from tests.agent.kvevents.kvstreams import fixture_streams, recorded_frames
from tests.agent.kvevents.reference_model import RefLeverModel, RefTierModel
from tests.agent.kvevents.workloads import WORKLOADS, GpuPrefixCache, keys_of, replay

Stream = list[tuple[Batch, float | None]]


def random_stream(rng: random.Random, n_requests: int) -> Stream:
    """Requests over documents with shared prefixes, through a small GPU prefix cache, with the
    stream's odd cases mixed in at random."""
    block = rng.choice([1, 4, 16])
    shared = [rng.randrange(1, 50) for _ in range(rng.randint(0, 3) * block)]
    docs = [shared + [rng.randrange(1, 30_000) for _ in range(rng.randint(1, 12) * block)] for _ in range(12)]
    gpu = GpuPrefixCache(rng.choice([4, 16, 64]), block)
    out: Stream = []
    seq = {0: 0, 1: 0}
    ts = 1000.0
    alpha = rng.choice([0.6, 1.0, 1.5])
    for _ in range(n_requests):
        rank = 0 if rng.random() < 0.85 else 1
        d = docs[min(int(rng.paretovariate(alpha)) - 1, len(docs) - 1)]
        prompt = d + [rng.randrange(1, 30_000) for _ in range(rng.randint(0, 3) * block)]
        _, events = gpu.serve(keys_of(prompt, block))
        evs: list[Event] = list(events)
        if evs and isinstance(evs[-1], Stored) and len(evs[-1].hashes) > 2 and rng.random() < 0.3:
            st = evs.pop()  # a chunked prefill: the same request's chain in two events
            cut = rng.randint(1, len(st.hashes) - 1)
            evs.append(Stored(st.hashes[:cut], st.parent, block, "GPU", cut * block))
            evs.append(Stored(st.hashes[cut:], st.hashes[cut - 1], block, "GPU", (len(st.hashes) - cut) * block))
        roll = rng.random()
        if roll < 0.02:
            evs.append(Cleared())
            gpu.cached.clear()
        elif roll < 0.05 and evs:
            st0 = next((e for e in evs if isinstance(e, Stored)), None)
            if st0 is not None:  # a hybrid model's other group, and another medium's traffic
                evs.append(Stored(st0.hashes, st0.parent, block, "GPU", 0, group_idx=1))
                evs.append(Stored(st0.hashes, None, block, "CPU", 0))
                evs.append(Removed(st0.hashes[:1], "CPU"))
        ts += rng.random()
        now: float | None = ts + (rng.choice([0.5, 30.0]) if rng.random() < 0.1 else 0.1)
        if rng.random() < 0.2:
            now = None
        s = seq[rank]
        roll = rng.random()
        if roll < 0.02:
            s = 0  # sequence back with a newer timestamp: a restarted engine
        elif roll < 0.04:
            s = s + rng.choice([3, 2_000_000])  # lost messages, or a garbage sequence number
        seq[rank] = s + 1
        batch = Batch(b"kv", s, ts, rank if rank or rng.random() < 0.5 else None, evs)
        out.append((batch, now))
        if rng.random() < 0.03:  # the same message again (a replay answering twice)
            out.append((Batch(b"kv", s, ts, batch.dp_rank, list(evs)), now))
    return out


def workload_stream(name: str, gpu_blocks: int, block: int, limit: int | None = None) -> Stream:
    prompts = WORKLOADS[name]()[:limit]
    batches, _ = replay(prompts, gpu_blocks, block)
    return [(b, None) for b in batches]


def recorded_stream(path: Any) -> Stream:
    out: Stream = []
    for f in recorded_frames(path):
        out.append((decode_message(f), None))
    return out


def windows(model: Any, stream: Stream, every: int) -> Iterator[Any]:
    """Each window (taken every ``every`` batches and at the end) and the model's state then."""
    for i, (batch, now) in enumerate(stream):
        model.observe(batch, now)
        if (i + 1) % every == 0:
            yield model.take_window(float(i)), model.tracked_keys(), model.rate(), model.opt_snapshot()
    yield model.take_window(1e9), model.tracked_keys(), model.rate(), model.opt_snapshot()


def assert_same(fast: Any, ref: Any, stream: Stream, every: int = 25) -> None:
    for n, (got, want) in enumerate(zip(windows(fast, stream, every), windows(ref, stream, every), strict=True)):
        assert got[0] == want[0], f"window {n}"
        assert got[1:3] == want[1:3], f"tracked keys / rate after window {n}"
        assert got[3] == want[3], f"opt-bound access log after window {n}"


CAPS: list[Any] = [(), (1, 2, 3, 5, 8, 13, 21, 34, 55), (4, 16, 64, 256), None]


@pytest.mark.parametrize("seed", range(24))
def test_on_random_streams_the_fast_model_gives_exactly_the_reference_windows(seed):
    rng = random.Random(seed)
    stream = random_stream(rng, 300)
    caps = CAPS[seed % len(CAPS)]
    kw: dict[str, Any] = {"max_keys": rng.choice([None, 16, 64, 1000]), "rate": rng.choice([1.0, 1.0, 0.5])}
    if caps is not None:
        kw["capacities"] = caps
    kw["arc"] = seed % 3 == 0
    if seed % 2:
        kw["opt_accesses"] = rng.choice([0, 100])
    assert_same(TierModel("i", now=0.0, **kw), RefTierModel("i", now=0.0, **kw), stream, every=rng.choice([7, 50]))


@pytest.mark.parametrize("seed", range(8))
def test_on_random_streams_the_lever_model_gives_exactly_the_reference_windows(seed):
    rng = random.Random(100 + seed)
    stream = random_stream(rng, 300)
    kw: dict[str, Any] = {"max_keys": rng.choice([None, 32]), "pool_max_keys": rng.choice([8, 64, 8192])}
    kw["arc"] = seed % 4 == 0
    assert_same(LeverModel("i", now=0.0, **kw), RefLeverModel("i", now=0.0, **kw), stream)


@pytest.mark.parametrize(
    ("name", "gpu_blocks", "block"),
    [("rotation", 455, 16), ("chat", 455, 16), ("rag", 455, 16), ("rotation", 200, 32), ("rag", 120, 64)],
)
def test_on_the_three_workloads_the_fast_model_gives_exactly_the_reference_windows(name, gpu_blocks, block):
    stream = workload_stream(name, gpu_blocks, block, limit=100)
    caps = (16, 64, 113, 227, 455, 910, 1820)
    assert_same(
        TierModel("i", now=0.0, max_keys=None, capacities=caps, arc=block == 16 and name == "chat"),
        RefTierModel("i", now=0.0, max_keys=None, capacities=caps, arc=block == 16 and name == "chat"),
        stream,
    )
    assert_same(LeverModel("i", now=0.0, max_keys=256), RefLeverModel("i", now=0.0, max_keys=256), stream)


@pytest.mark.parametrize("path", fixture_streams(), ids=lambda p: p.name)
def test_on_the_recorded_real_streams_the_fast_model_gives_exactly_the_reference_windows(path):
    stream = recorded_stream(path)
    for caps in [tuple(range(1, 64)), None]:
        kw: dict[str, Any] = {"max_keys": None} if caps is None else {"max_keys": None, "capacities": caps}
        assert_same(TierModel("i", now=0.0, **kw), RefTierModel("i", now=0.0, **kw), stream, every=5)
    assert_same(LeverModel("i", now=0.0, arc=True), RefLeverModel("i", now=0.0, arc=True), stream, every=5)


def test_a_long_stream_that_fills_every_tier_and_the_sampler_gives_exactly_the_reference_windows():
    """Every size evicts and the SHARDS threshold drops many times (the bench's kind of stream)."""
    rng = random.Random(3)
    stream: Stream = []
    hot = [rng.getrandbits(64) for _ in range(3000)]
    parent: int | None = None

    def pick() -> int:
        return hot[int(rng.paretovariate(0.7)) % 3000] if rng.random() < 0.6 else rng.getrandbits(64)

    for seq in range(1000):
        hashes = tuple(dict.fromkeys(pick() for _ in range(8)))  # a chain names a block once
        evs: list[Event] = [Removed(hashes[:2], "GPU"), Stored(hashes, parent if seq % 5 else None, 16, "GPU", 128)]
        parent = hashes[-1] if rng.random() < 0.5 else None
        stream.append((Batch(b"kv", seq, float(seq), 0, evs), None))
    caps = (16, 23, 32, 45, 64, 91, 128, 181, 256, 362, 512, 724, 1024, 1448, 2048)
    assert_same(
        TierModel("i", now=0.0, max_keys=512, capacities=caps),
        RefTierModel("i", now=0.0, max_keys=512, capacities=caps),
        stream,
        every=400,
    )
    assert_same(
        LeverModel("i", now=0.0, max_keys=512, pool_max_keys=256),
        RefLeverModel("i", now=0.0, max_keys=512, pool_max_keys=256),
        stream,
        every=400,
    )
