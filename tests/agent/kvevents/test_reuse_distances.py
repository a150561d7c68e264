"""Mattson's stack distances against a brute-force LRU, and SHARDS against the exact pass."""

from __future__ import annotations

import bisect
import itertools
import random
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.kvevents.reuse import (
    BIN_EDGES,
    LruStack,
    ReuseSampler,
    bin_lower,
    bin_upper,
    distances_histogram,
    hits_at,
)


def lru_hits(keys: list[int], capacity: int) -> int:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for k in keys:
        if k in cache:
            hits += 1
            cache.move_to_end(k)
        else:
            cache[k] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits


def zipf_trace(n_keys: int, n_refs: int, alpha: float, seed: int) -> list[int]:
    rng = random.Random(seed)
    cum = list(itertools.accumulate(1 / (i + 1) ** alpha for i in range(n_keys)))
    perm = list(range(n_keys))
    rng.shuffle(perm)
    return [perm[bisect.bisect_left(cum, rng.random() * cum[-1])] * 7919 + 12345 for _ in range(n_refs)]


def test_stack_distances_of_a_small_stream_by_hand():
    s = LruStack()
    assert [s.access(k) for k in [1, 1, 2, 1, 3, 2, 1, 1]] == [None, 0, None, 1, None, 2, 2, 0]


def test_stack_distances_survive_renumbering_when_the_tree_fills():
    s = LruStack(initial=16)
    out = [s.access(k) for k in [*range(40), 0, 39, 39, 5]]
    assert out[40:] == [39, 1, 0, 35]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=400),
    st.integers(min_value=1, max_value=50),
)
def test_one_pass_gives_the_hits_of_a_brute_force_lru_of_every_size(keys, capacity):
    hist, cold, total = distances_histogram(keys)
    assert total == len(keys) and cold == len(set(keys))
    assert hits_at(hist, capacity) == lru_hits(keys, capacity)


def test_exact_pass_equals_brute_force_lru_on_a_long_skewed_trace_at_every_bin_edge():
    keys = zipf_trace(3000, 30_000, 0.9, seed=5)
    hist, _, _ = distances_histogram(keys)
    for capacity in [1, 2, 7, 63, 64, *BIN_EDGES[64:120:7], 3000]:
        assert hits_at(hist, capacity) == lru_hits(keys, capacity), capacity


def test_forgotten_keys_leave_the_stack():
    s = LruStack()
    for k in [1, 2, 3]:
        s.access(k)
    s.forget(2)
    assert len(s) == 2 and s.access(1) == 1


def test_bins_are_exact_below_64_and_cover_every_distance():
    assert [bin_lower(d) for d in range(64)] == list(range(64))
    for d in [64, 65, 100, 1000, 123_456, 10**9]:
        lo = bin_lower(d)
        assert lo <= d < bin_upper(lo)
    assert all(b > a for a, b in itertools.pairwise(BIN_EDGES))


def test_sampler_refuses_a_rate_or_bound_out_of_range():
    with pytest.raises(ValueError):
        ReuseSampler(rate=0)
    with pytest.raises(ValueError):
        ReuseSampler(rate=1.5)
    with pytest.raises(ValueError):
        ReuseSampler(max_keys=0)


def test_sampler_memory_stays_under_its_bound_whatever_the_distinct_keys():
    sampler = ReuseSampler(rate=1.0, max_keys=500)
    rng = random.Random(3)
    for _ in range(50_000):
        sampler.access(rng.getrandbits(64))
        assert len(sampler.stack) <= 500
    assert sampler.rate < 0.05


def test_shards_fixed_size_error_against_the_exact_pass_on_a_large_trace():
    """FAST'15 reports mean absolute miss-ratio error < 0.01 for fixed-size SHARDS with ~8K keys."""
    keys = zipf_trace(200_000, 400_000, 0.8, seed=3)
    n = len(keys)
    exact, _, _ = distances_histogram(keys)
    sampled, _, weight = distances_histogram(keys, rate=1.0, max_keys=8192)
    sampled[0] = sampled.get(0, 0.0) + (n - weight)  # SHARDS-adj
    sizes = [1000, 5000, 10_000, 20_000, 50_000, 100_000, 150_000]
    errors = [abs(hits_at(exact, c) / n - hits_at(sampled, c) / n) for c in sizes]
    assert sum(errors) / len(errors) < 0.01, errors
    assert max(errors) < 0.03, errors


def test_shards_fixed_rate_samples_about_the_rate_of_keys():
    keys = list(range(100_000))
    sampler = ReuseSampler(rate=0.01)
    picked = sum(1 for k in keys if sampler.access(k)[0])
    assert 800 < picked < 1200
