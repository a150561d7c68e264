"""The tier model on the recorded real stream and on built streams: prefix rule, epochs, gaps."""

from __future__ import annotations

import json
import random

import pytest

from agent.kvevents.decode import Stored, decode_message
from agent.kvevents.reuse import hits_at
from agent.kvevents.tier_model import TierModel
from tests.agent.kvevents.kvstreams import FIXTURES, fixture_streams, message, recorded_frames, removed_map, stored_map
from tests.agent.kvevents.vllm_tier import VllmLruTier

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


def points_of(window) -> dict[int, float]:
    return {int(c): n for c, n in window.points}


def requests_of(stored: list[Stored]) -> list[tuple[list[int], int]]:
    """Each BlockStored as vLLM's request: (its chunk keys in prefix order, GPU-hit chunks), the
    GPU-hit prefix found back through the parents of the blocks stored before."""
    parent: dict[int, int | None] = {}
    out = []
    for ev in stored:
        prefix: list[int] = []
        h = ev.parent
        while h is not None and h not in prefix:
            prefix.append(h)
            h = parent.get(h)
        prev = ev.parent
        for b in ev.hashes:
            parent[b] = prev
            prev = b
        out.append(([*reversed(prefix), *ev.hashes], len(prefix)))
    return out


def vllm_tier(stored: list[Stored], capacity: int) -> int:
    """Chunks vLLM's LRU tier of ``capacity`` chunks loads for this stream (tests/agent/kvevents/vllm_tier.py)."""
    tier = VllmLruTier(capacity)
    return sum(tier.serve(keys, hit) for keys, hit in requests_of(stored))


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


def test_on_the_real_stream_the_model_equals_vllms_tier_at_every_size():
    frames = recorded_frames(ROTATION)
    window = run(frames, max_keys=None, capacities=range(1, 64)).take_window(10.0)
    stored = [e for f in frames for e in decode_message(f).events if isinstance(e, Stored)]
    points = points_of(window)
    assert [points[c] for c in range(1, 64)] == [vllm_tier(stored, c) for c in range(1, 64)]
    hist = hist_of(window)
    distinct = len({h for e in stored for h in e.hashes})
    # an unbounded tier serves every block stored before: 64 blocks = 8,192 tokens here
    assert window.cold == distinct == 51
    assert hits_at(hist, 10**9) == window.references - distinct == 64


def test_a_block_whose_parent_was_a_gpu_hit_is_counted_like_vllms_tier():
    # request 1 stores [1, 2]; the GPU drops 2 (tails go first) and request 2 recomputes only 2
    # (1 was a GPU hit, which publishes nothing, so the tier never sees it); others follow; both
    # leave the GPU and request 3 stores [1, 2] again.
    frames = [message(0, [stored_map([1, 2])]), message(1, [removed_map([2]), stored_map([2], parent=1)])]
    frames += [message(2 + i, [stored_map([100 + i])]) for i in range(3)]
    frames += [message(5, [removed_map([1, 2]), stored_map([1, 2])])]
    window = run(frames, max_keys=None, capacities=range(1, 8)).take_window(1.0)
    stored = [e for f in frames for e in decode_message(f).events if isinstance(e, Stored)]
    points = points_of(window)
    assert [points[c] for c in range(1, 8)] == [vllm_tier(stored, c) for c in range(1, 8)]
    # a 1-chunk tier cannot take request 1's two chunks: it stores nothing (vLLM's prepare_store)
    assert [points[c] for c in range(1, 8)] == [0, 1, 1, 1, 3, 3, 3]


def test_chains_continue_across_events_through_the_parent_hash():
    frames = [
        message(0, [stored_map([1, 2])]),
        message(1, [stored_map([3], parent=2)]),
        message(2, [stored_map([50 + i]) for i in range(10)]),
        message(3, [removed_map([1, 2, 3]), stored_map([1, 2]), stored_map([3], parent=2)]),
    ]
    window = run(frames, max_keys=None, capacities=range(1, 20)).take_window(1.0)
    stored = [e for f in frames for e in decode_message(f).events if isinstance(e, Stored)]
    points = points_of(window)
    assert [points[c] for c in range(1, 20)] == [vllm_tier(stored, c) for c in range(1, 20)]


def test_random_streams_match_vllms_tier():
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
        caps = [1, 3, 8, 20, 40, 63]
        window = run(frames, max_keys=None, capacities=caps).take_window(1.0)
        stored = [e for f in frames for e in decode_message(f).events if isinstance(e, Stored)]
        points = points_of(window)
        assert [points[c] for c in caps] == [vllm_tier(stored, c) for c in caps]


def test_a_second_copy_announced_while_the_first_is_on_the_gpu_is_a_tier_lookup():
    """vLLM 0.32 announces a block only when a request computed or loaded it, and does not
    de-duplicate (BlockPool.cache_full_blocks, NOTE #1): a block announced again while another copy
    is on the GPU was computed or loaded by a request scheduled before that copy was cached (most
    often one that loaded the same prefix while another request's load was in flight: loaded blocks
    are cached only when the load completes). That request looked the tier up: the second copy is a
    lookup, and a tier holding the chunks loaded them twice (external_kv_transfer counts both)."""
    frames = [message(0, [stored_map([1, 2])]), message(1, [stored_map([1, 2])]), message(2, [removed_map([1, 2])])]
    frames.append(message(3, [stored_map([1, 2])]))
    window = run(frames, max_keys=None, capacities=[2, 8]).take_window(1.0)
    assert window.reannounced == 0 and window.references == window.sampled == 6
    assert window.cold == 2 and hits_at(hist_of(window), 100) == 4
    assert points_of(window) == {2: 4, 8: 4}


def test_all_blocks_cleared_and_a_restarted_publisher_start_new_epochs():
    frames = [
        message(10, [stored_map([1])], ts=1.0),
        message(11, [{"type": "AllBlocksCleared"}], ts=1.0),
        message(12, [stored_map([1])], ts=1.0),
        message(0, [stored_map([1])], ts=2.0),  # sequence went back, newer timestamp: a restarted engine
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


def test_a_backlog_vllm_queued_while_nobody_listened_changes_state_but_is_not_counted_as_now():
    """vLLM delivers batches it queued before anyone listened in a burst at connect: by their own
    vLLM timestamp they are old, so they are left out of the window (and said so)."""
    model = TierModel("u", now=100.0, max_keys=None)
    model.observe(decode_message(message(0, [stored_map([1, 2])], ts=20.0)), now=100.0)  # 80 s old
    model.observe(decode_message(message(1, [stored_map([3, 4])], ts=21.0)), now=100.0)
    model.observe(decode_message(message(2, [removed_map([1, 2]), stored_map([1, 2])], ts=99.9)), now=100.0)
    w = model.take_window(101.0)
    assert (w.stale_messages, w.stale_tokens, w.messages) == (2, 64, 1)
    assert w.references == 2 and w.stored_tokens == 32  # only the live batch is counted
    assert w.cold == 0 and hits_at(hist_of(w), 100) == 2  # but the backlog's blocks were seen before
    assert (w.first_ts, w.last_ts) == (99.9, 99.9)


def test_a_duplicated_or_replayed_message_is_skipped_not_taken_as_a_restart():
    model = TierModel("u", now=0.0, max_keys=None)
    frames = [message(5, [stored_map([1])], ts=1.0), message(6, [stored_map([2])], ts=2.0)]
    frames += [message(6, [stored_map([2])], ts=2.0), message(5, [stored_map([1])], ts=1.0)]  # seen again
    frames += [message(7, [removed_map([1]), stored_map([1])], ts=3.0)]
    for f in frames:
        model.observe(decode_message(f))
    w = model.take_window(1.0)
    assert (w.duplicates, w.epochs, w.references) == (2, 0, 3)
    assert hits_at(hist_of(w), 100) == 1  # history kept: block 1 is a reuse, not a first sight


def test_one_garbage_sequence_number_does_not_inflate_lost():
    model = TierModel("u", now=0.0, max_keys=None)
    for seq in (0, 1, 2**62, 2, 3):
        model.observe(decode_message(message(seq, [stored_map([seq % 1000])], ts=1.0)))
    w = model.take_window(1.0)
    assert w.lost == 0 and w.garbage == 1 and w.references == 4


def test_a_hybrid_models_other_kv_groups_are_not_counted_twice():
    """Hybrid models publish one BlockStored per KV-cache group for the same tokens."""
    ev0 = stored_map([1, 2])
    ev1 = {**stored_map([1, 2]), "group_idx": 1, "kv_cache_spec_kind": "sliding_window"}
    model = TierModel("u", now=0.0, max_keys=None)
    model.observe(decode_message(message(0, [ev0, ev1])))
    w = model.take_window(1.0)
    assert (w.references, w.stored_tokens, w.other_group_blocks, w.kv_groups) == (2, 32, 2, 2)


def test_the_model_follows_vllms_tier_on_three_workloads_where_a_stack_pass_cannot():
    """Built streams of the three workloads through a GPU prefix cache: the simulated points are
    vLLM's tier exactly; the one-pass stack curve alone misses where the tier stores nothing."""
    from tests.agent.kvevents.workloads import WORKLOADS, replay

    caps = (113, 227, 455, 910, 1820)
    misses = 0
    for name, make in WORKLOADS.items():
        batches, served = replay(make(), 455, 16)
        model = TierModel("u", now=0.0, max_keys=None, capacities=caps)
        for b in batches:
            model.observe(b)
        w = model.take_window(1.0)
        points, hist = points_of(w), hist_of(w)
        for c in caps:
            tier = VllmLruTier(c)
            expected = sum(tier.serve(keys, hit) for keys, hit in served)
            assert points[c] == expected, (name, c)
            misses += hits_at(hist, c) != expected
    assert misses > 0


def test_the_backlog_fixture_is_left_out_by_its_vllm_timestamps_and_the_rest_reconciles_to_the_token():
    from app.sizing.curve import add_windows, reconcile
    from app.storage.sizing_store import COUNT_FIELDS

    path = FIXTURES / "replayed__vllm-0.32.0-cpu__tiny__backlog.events.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    frames = recorded_frames(path)
    requests = json.loads((FIXTURES / ROTATION.name.replace(".events.jsonl", ".requests.json")).read_text())
    tails = sum(r["prompt_tokens"] % 128 for r in requests)

    def window(with_now: bool):
        model = TierModel("u", now=lines[0]["recv_ts"], max_keys=None)
        for line, f in zip(lines, frames, strict=True):
            model.observe(decode_message(f), now=line["recv_ts"] if with_now else None)
        return model.take_window(lines[-1]["recv_ts"] + 1)

    def verdict(w) -> str:
        row = {"counts": {f: getattr(w, f) for f in COUNT_FIELDS}, "block_size": w.block_size, "rate": w.rate}
        row["bins"] = w.bins
        by_source = {"local_compute": float(LOCAL_COMPUTE), "external_kv_transfer": 0.0}
        return reconcile(add_windows([row]), by_source, float(len(requests)), 80.0)["status"]

    w = window(with_now=True)
    assert (w.stale_messages, w.messages, w.lost) == (20, 17, 0)
    assert w.stored_tokens + tails == LOCAL_COMPUTE  # to the token, once the backlog is left out
    assert verdict(w) == "ok"
    counted_as_now = window(with_now=False)
    assert counted_as_now.stored_tokens > LOCAL_COMPUTE and verdict(counted_as_now) == "mismatch"


def test_with_arc_the_model_follows_vllms_arc_tier_which_an_lru_curve_does_not():
    from tests.agent.kvevents.vllm_tier import VllmArcTier
    from tests.agent.kvevents.workloads import WORKLOADS, replay

    caps = (113, 455, 910)
    differs = 0
    for name, make in WORKLOADS.items():
        batches, served = replay(make()[:60], 455, 16)
        model = TierModel("u", now=0.0, max_keys=None, capacities=caps, arc=True)
        for b in batches:
            model.observe(b)
        w = model.take_window(1.0)
        arc, lru = {int(c): n for c, n in w.arc_points}, points_of(w)
        for c in caps:
            tier = VllmArcTier(c)
            assert arc[c] == sum(tier.serve(keys, hit) for keys, hit in served), (name, c)
            differs += arc[c] != lru[c]
    assert differs > 0


def test_arc_on_random_streams_matches_vllms_arc_tier():
    from tests.agent.kvevents.vllm_tier import VllmArcTier

    rng = random.Random(5)
    for _ in range(20):
        docs = [[rng.getrandbits(64) for _ in range(rng.randint(1, 6))] for _ in range(14)]
        frames = []
        for seq in range(80):
            doc = docs[min(int(rng.paretovariate(0.8)) - 1, 13)]
            cut = rng.randint(1, len(doc))
            events = [removed_map(doc), stored_map(doc[:cut])]
            if doc[cut:]:
                events.append(stored_map(doc[cut:], parent=doc[cut - 1]))
            frames.append(message(seq, events))
        caps = [1, 2, 4, 8, 16, 32]
        w = run(frames, max_keys=None, capacities=caps, arc=True).take_window(1.0)
        stored = [e for f in frames for e in decode_message(f).events if isinstance(e, Stored)]
        arc = {int(c): n for c, n in w.arc_points}
        for c in caps:
            tier = VllmArcTier(c)
            assert arc[c] == sum(tier.serve(keys, hit) for keys, hit in requests_of(stored)), c


REAL_BACKLOG = FIXTURES / "real__vllm-0.32.0-cpu__tiny__backlog.events.jsonl"


@pytest.mark.skipif(not REAL_BACKLOG.exists(), reason="the real backlog capture is not recorded here")
def test_a_real_backlog_after_the_agent_came_back_is_left_out_and_the_live_part_reconciles_to_the_token():
    """Recorded from a real vLLM (tests/realvllm/record_backlog.py): the agent listened, went away
    while vLLM served on (its PUB queued for the lost peer), and came back to a burst of old batches."""
    from app.sizing.curve import add_windows, reconcile
    from app.storage.sizing_store import COUNT_FIELDS

    lines = [json.loads(line) for line in REAL_BACKLOG.read_text().splitlines() if line.strip()]
    frames = recorded_frames(REAL_BACKLOG)
    counters = json.loads(REAL_BACKLOG.with_name(REAL_BACKLOG.name.replace(".events.jsonl", ".marks.json")).read_text())
    requests = json.loads(
        REAL_BACKLOG.with_name(REAL_BACKLOG.name.replace(".events.jsonl", ".requests.json")).read_text()
    )
    after = [r for r in requests if r["phase"] == "after"]
    computed = counters["at_end"]["src:local_compute"] - counters["at_rebind"]["src:local_compute"]
    tails = sum(r["prompt_tokens"] % 128 for r in after)

    def window(with_now: bool):
        model = TierModel("u", now=0.0, max_keys=None)
        for line, f in zip(lines, frames, strict=True):
            model.observe(decode_message(f), now=line["recv_ts"] if with_now else None)
            if line["phase"] == "first":
                model.take_window(line["recv_ts"])  # the first listening period is its own window
        return model.take_window(lines[-1]["recv_ts"] + 1)

    def verdict(w) -> str:
        row = {"counts": {f: getattr(w, f) for f in COUNT_FIELDS}, "block_size": w.block_size, "rate": w.rate}
        row["bins"] = w.bins
        return reconcile(add_windows([row]), {"local_compute": computed}, float(len(after)), 20.0)["status"]

    w = window(with_now=True)
    backlog = sum(1 for line in lines if line["phase"] == "after" and line["recv_ts"] - msg_ts(line) > 10)
    assert backlog > 0 and w.stale_messages == backlog and w.lost == 0
    assert w.stored_tokens + tails == computed
    assert verdict(w) == "ok"
    assert verdict(window(with_now=False)) == "mismatch"


def msg_ts(line: dict) -> float:
    import base64

    import msgpack

    return float(msgpack.unpackb(base64.b64decode(line["frames_b64"][2]), strict_map_key=False)[0])
