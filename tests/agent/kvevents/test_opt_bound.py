"""The optimal-eviction bound over the agent's window of recent accesses (agent/kvevents/opt_bound.py)."""

from __future__ import annotations

import random
from functools import cache

import pytest

from agent.kvevents.opt_bound import AccessLog, bound, ceiling_hits, opt_hits, trace


def brute_force_opt(keys: list[int], lookup: list[bool], capacity: int) -> int:
    """Every schedule: after each access the tier holds any subset (at most ``capacity``) of what
    it held plus the block just referenced; a lookup of a held block is a hit."""

    @cache
    def best(i: int, held: frozenset[int]) -> int:
        if i == len(keys):
            return 0
        k = keys[i]
        hit = 1 if lookup[i] and k in held else 0
        pool = sorted(held | {k})
        out = 0
        for mask in range(1 << len(pool)):
            state = frozenset(p for b, p in enumerate(pool) if mask >> b & 1)
            if len(state) <= capacity:
                out = max(out, best(i + 1, state))
        return hit + out

    return best(0, frozenset())


def random_requests(rng: random.Random, n: int, keys: int) -> list[tuple[list[int], int]]:
    out = []
    for _ in range(n):
        ks = rng.sample(range(keys), rng.randint(1, 3))
        out.append((ks, rng.randint(0, len(ks) - 1)))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_opt_equals_a_brute_force_belady_on_small_traces(seed: int) -> None:
    rng = random.Random(seed)
    reqs = random_requests(rng, rng.randint(3, 6), 5)
    keys, lookup = trace(reqs)
    for c in (1, 2, 3):
        assert opt_hits(keys, lookup, c) == brute_force_opt(keys, lookup, c), (reqs, c)


@pytest.mark.parametrize("seed", range(20))
def test_lru_never_beats_opt_and_opt_never_beats_the_ceiling(seed: int) -> None:
    """vLLM's LRU tier (its lookup, store and re-rank rules) against OPT and an unbounded tier,
    on request streams of shared prefixes: 0 <= lru <= opt <= ceiling at every size."""
    rng = random.Random(seed)
    docs = [[rng.getrandbits(63) for _ in range(rng.randint(4, 40))] for _ in range(12)]
    reqs: list[tuple[list[int], int]] = []
    for _ in range(300):
        d = docs[min(int(rng.paretovariate(1.0)) - 1, 11)]
        gpu = rng.randint(0, len(d) // 2)
        reqs.append(([*d, *(rng.getrandbits(63) for _ in range(rng.randint(0, 3)))], gpu))
    points = bound(reqs, [1, 4, 16, 32, 64, 128, 256, 1024])
    keys, lookup = trace(reqs)
    ceiling = ceiling_hits(keys, lookup)
    assert ceiling > 0
    for p in points:
        assert 0 <= p.lru <= p.opt <= p.ceiling == ceiling, p
    assert points[-1].opt == ceiling  # a tier holding the whole window loses nothing
    assert any(p.opt > p.lru for p in points)  # LRU leaves something to a better policy


def test_the_log_keeps_whole_requests_up_to_its_bound_oldest_dropped_first() -> None:
    log = AccessLog(max_accesses=10)
    log.add([1, 2], [3, 4])
    log.add([], [5, 6, 7])
    log.add([5], [8, 9, 10])  # 4 + 3 + 4 = 11 > 10: the first request goes
    assert [list(k) for k, _ in log.snapshot()] == [[5, 6, 7], [5, 8, 9, 10]]
    assert log.accesses == 7 and log.added == 11
    log.add([], list(range(100, 130)))  # one request over the bound is kept alone
    assert log.accesses == 30 and len(log.snapshot()) == 1


def test_the_model_logs_its_requests_and_the_subscriber_attaches_the_bound_to_a_later_window() -> None:
    """The model keeps each request's GPU-hit prefix and stored blocks; the subscriber's push
    starts the bound on a snapshot off its threads and hands it over with a later window."""
    from agent.kvevents.decode import Batch, Removed, Stored
    from agent.kvevents.subscriber import Subscriber
    from agent.kvevents.tier_model import TierModel

    model = TierModel("http://v", now=0.0, max_keys=None, capacities=(2, 8))
    doc = list(range(1, 7))
    events = [Stored(tuple(doc), None, 16, "GPU", 0)]
    for n in range(6):  # the document evicted from the GPU each time: stored again, a lookup
        events.append(Removed(tuple(doc), "GPU"))
        events.append(Stored(tuple(doc), None, 16, "GPU", 0))
        events.append(Stored((1000 + n,), doc[-1], 16, "GPU", 0))  # a unique tail after a GPU hit
    model.observe(Batch(b"", 0, 1.0, 0, events))
    [snap] = model.opt_snapshot()
    assert [(list(k), n) for k, n in snap[:3]] == [(doc, 0), (doc, 0), ([*doc, 1000], 6)]  # GPU hits, then stored
    sub = Subscriber("http://v", [], model)
    first = sub.take_window(10.0)  # starts the bound on a snapshot (it may finish in time for this one)
    sub.bound.join(30)
    model.observe(Batch(b"", 1, 11.0, 0, [Stored((5000,), None, 16, "GPU", 0)]))
    second = sub.take_window(20.0)
    assert first is not None and second is not None
    carried = [w for w in (first, second) if w.opt_bound]
    assert len(carried) == 1  # handed over once
    w = carried[0]
    assert w.opt_accesses == sum(len(k) for k, _ in snap) == 84
    rows = {int(c): (lru, opt, ceiling) for c, lru, opt, ceiling in w.opt_bound}
    assert rows[8] == (36, 36, 36)  # the whole document held: every re-store reloads
    assert rows[2] == (0, 12, 36)  # vLLM's tier cannot store six chunks in two; OPT keeps two
