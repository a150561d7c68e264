"""The tier model on the recorded real stream and on built streams: prefix rule, epochs, gaps."""

from __future__ import annotations

import json
import random
from collections import OrderedDict

import pytest

from agent.kvevents.decode import Stored, decode_message
from agent.kvevents.reuse import hits_at
from agent.kvevents.tier_model import TierModel
from tests.sizing.kvstreams import FIXTURES, fixture_streams, message, recorded_frames, removed_map, stored_map

ROTATION = next(p for p in fixture_streams() if "rotation" in p.name)
# vLLM's counter deltas over the capture (the fixture's NOTES.md)
LOCAL_COMPUTE = 82_201 - 64_491
LOCAL_CACHE_HIT = 69_120 - 50_048


def run(frames: list[list[bytes]], **kw) -> TierModel:
    model = TierModel("http://vllm", now=0.0, **kw)
    for f in frames:
        model.observe(decode_message(f))
    return model


def hist_of(window) -> dict[int, float]:
    return {int(lo): w for lo, w in window.bins}


def brute_force_tier(stored: list[Stored], capacity: int) -> int:
    """An LRU tier of `capacity` blocks fed every GPU store; a block reloads only if its whole chain did."""
    cache: OrderedDict[int, None] = OrderedDict()
    chain_ok: dict[int, bool] = {}
    hits = 0
    for ev in stored:
        ok = chain_ok.pop(ev.parent, True) if ev.parent is not None else True
        for h in ev.hashes:
            ok = ok and h in cache
            hits += ok
            cache[h] = None
            cache.move_to_end(h)
            if len(cache) > capacity:
                cache.popitem(last=False)
        chain_ok[ev.hashes[-1]] = ok
    return hits


def test_the_real_stream_accounts_for_every_computed_prompt_token_vllm_counted():
    frames = recorded_frames(ROTATION)
    window = run(frames, max_keys=None).take_window(10.0)
    requests = json.loads((FIXTURES / ROTATION.name.replace(".events.jsonl", ".requests.json")).read_text())
    prompt = sum(r["prompt_tokens"] for r in requests)
    tails = sum(r["prompt_tokens"] % 128 for r in requests)  # partial last blocks are never cached
    assert prompt == LOCAL_COMPUTE + LOCAL_CACHE_HIT
    assert window.block_size == 128
    assert window.stored_tokens + tails == LOCAL_COMPUTE  # every computed full block was announced
    assert window.references * 128 == window.stored_tokens
    # full blocks of the log = GPU hits + blocks vLLM stored
    assert (prompt - tails) // 128 == LOCAL_CACHE_HIT // 128 + window.references
    assert window.lost == 0 and window.garbage == 0 and window.messages == 17


def test_on_the_real_stream_the_curve_equals_a_brute_force_tier_at_every_size():
    frames = recorded_frames(ROTATION)
    window = run(frames, max_keys=None).take_window(10.0)
    stored = [e for f in frames for e in decode_message(f).events if isinstance(e, Stored)]
    hist = hist_of(window)
    for capacity in range(0, 64):
        assert hits_at(hist, capacity) == brute_force_tier(stored, capacity), capacity
    distinct = len({h for e in stored for h in e.hashes})
    # an unbounded tier serves every block stored before: 64 blocks = 8,192 tokens here
    assert window.cold == distinct == 51
    assert hits_at(hist, 10**9) == window.references - distinct == 64


def test_a_block_whose_parent_was_a_gpu_hit_is_counted_like_a_brute_force_tier():
    # request 1 stores [1, 2]; the GPU drops 2 (tails go first) and request 2 recomputes only 2
    # (1 was a GPU hit, which publishes nothing, so the tier never sees it); others follow; both
    # leave the GPU and request 3 stores [1, 2] again.
    frames = [message(0, [stored_map([1, 2])]), message(1, [removed_map([2]), stored_map([2], parent=1)])]
    frames += [message(2 + i, [stored_map([100 + i])]) for i in range(3)]
    frames += [message(5, [removed_map([1, 2]), stored_map([1, 2])])]
    window = run(frames, max_keys=None).take_window(1.0)
    stored = [e for f in frames for e in decode_message(f).events if isinstance(e, Stored)]
    hist = hist_of(window)
    assert [hits_at(hist, c) for c in range(8)] == [brute_force_tier(stored, c) for c in range(8)]
    assert [hits_at(hist, c) for c in range(8)] == [0, 1, 1, 1, 1, 3, 3, 3]


def test_chains_continue_across_events_through_the_parent_hash():
    frames = [
        message(0, [stored_map([1, 2])]),
        message(1, [stored_map([3], parent=2)]),
        message(2, [stored_map([50 + i]) for i in range(10)]),
        message(3, [removed_map([1, 2, 3]), stored_map([1, 2]), stored_map([3], parent=2)]),
    ]
    window = run(frames, max_keys=None).take_window(1.0)
    stored = [e for f in frames for e in decode_message(f).events if isinstance(e, Stored)]
    hist = hist_of(window)
    for capacity in range(0, 20):
        assert hits_at(hist, capacity) == brute_force_tier(stored, capacity)


def test_random_streams_match_the_brute_force_tier():
    rng = random.Random(11)
    for _ in range(30):
        frames = []
        docs = [[rng.getrandbits(64) for _ in range(rng.randint(1, 6))] for _ in range(12)]
        for seq in range(60):
            doc = docs[min(int(rng.paretovariate(1.0)) - 1, 11)]
            cut = rng.randint(1, len(doc))
            # the GPU dropped the document since: removed, then stored again in one or two events
            events = [removed_map(doc), stored_map(doc[:cut])]
            if doc[cut:]:
                events.append(stored_map(doc[cut:], parent=doc[cut - 1]))
            frames.append(message(seq, events))
        window = run(frames, max_keys=None).take_window(1.0)
        stored = [e for f in frames for e in decode_message(f).events if isinstance(e, Stored)]
        hist = hist_of(window)
        for capacity in [0, 1, 3, 8, 20, 40, 63]:
            assert hits_at(hist, capacity) == brute_force_tier(stored, capacity)


def test_blocks_reannounced_while_on_the_gpu_are_gpu_hits_not_lookups():
    frames = [message(0, [stored_map([1, 2])]), message(1, [stored_map([1, 2])]), message(2, [removed_map([1, 2])])]
    frames.append(message(3, [stored_map([1, 2])]))
    window = run(frames, max_keys=None).take_window(1.0)
    assert window.reannounced == 2
    assert window.cold == 2 and hits_at(hist_of(window), 100) == 2


def test_all_blocks_cleared_and_a_restarted_publisher_start_new_epochs():
    frames = [
        message(10, [stored_map([1])]),
        message(11, [{"type": "AllBlocksCleared"}]),
        message(12, [stored_map([1])]),
        message(0, [stored_map([1])]),  # sequence went back: a restarted engine
    ]
    window = run(frames, max_keys=None).take_window(1.0)
    assert window.epochs == 2
    assert window.cold == 3 and window.bins == []


def test_sequence_gaps_are_counted_as_lost_messages_per_rank():
    model = TierModel("u", now=0.0)
    for seq, rank in [(0, 0), (1, 0), (5, 0), (0, 1), (2, 1)]:
        model.observe(decode_message(message(seq, [], rank=rank)))
    assert model.take_window(1.0).lost == 3 + 1


def test_dp_ranks_have_their_own_gpu_pools():
    model = TierModel("u", now=0.0, max_keys=None)
    model.observe(decode_message(message(0, [stored_map([1])], rank=0)))
    model.observe(decode_message(message(0, [stored_map([1])], rank=1)))  # rank 1's own first store
    w = model.take_window(1.0)
    assert w.cold == 2 and w.epochs == 0


def test_other_media_count_as_tier_traffic_not_as_gpu_lookups():
    model = TierModel("u", now=0.0)
    model.observe(decode_message(message(0, [stored_map([1, 2], medium="CPU"), removed_map([1], "CPU")])))
    w = model.take_window(1.0)
    assert (w.tier_stored, w.tier_removed, w.references) == (2, 1, 0)


def test_windows_restart_counting_and_an_idle_window_is_none():
    model = TierModel("u", now=0.0)
    model.observe(decode_message(message(0, [stored_map([1])])))
    first = model.take_window(1.0)
    assert first is not None and (first.start, first.end, first.references) == (0.0, 1.0, 1)
    assert model.take_window(2.0) is None
    model.garbage()
    assert model.take_window(3.0).garbage == 1


def test_sampled_model_stays_within_its_key_bound_on_a_long_stream():
    model = TierModel("u", now=0.0, max_keys=256)
    rng = random.Random(2)
    for seq in range(2000):
        model.observe(decode_message(message(seq, [stored_map([rng.getrandbits(64) for _ in range(8)])])))
        assert model.tracked_keys() <= 256
    w = model.take_window(1.0)
    assert w.references == 16_000 and w.rate < 1.0
    assert abs(w.cold - 16_000) < 1600  # every block new: the sampled estimate is close


def captures_with_a_tier() -> list:
    """Recorded streams of servers with a real external tier (their counters beside them)."""
    return [p for p in fixture_streams() if p.with_name(p.name.replace(".events.jsonl", ".counters.json")).exists()]


@pytest.mark.parametrize("path", captures_with_a_tier(), ids=lambda p: p.name)
def test_on_a_real_tier_capture_the_unbounded_prediction_is_the_measured_reload(path):
    counters = json.loads(path.with_name(path.name.replace(".events.jsonl", ".counters.json")).read_text())
    requests = json.loads(path.with_name(path.name.replace(".events.jsonl", ".requests.json")).read_text())
    window = run(recorded_frames(path), max_keys=None).take_window(1.0)
    block = window.block_size
    tails = sum(r["prompt_tokens"] % block for r in requests)
    external = counters["src:external_kv_transfer"]
    assert window.lost == 0 and window.garbage == 0
    assert window.references * block == counters["src:local_compute"] + external - tails
    assert external > 0
    assert hits_at(hist_of(window), 10**9) * block == external
