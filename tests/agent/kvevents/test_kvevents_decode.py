"""The KV-event decoder on every recorded stream and on every encoding vLLM has used."""

from __future__ import annotations

import random

import msgpack
import pytest

from agent.kvevents.decode import (
    MAX_PAYLOAD_BYTES,
    BadMessage,
    Cleared,
    Removed,
    Stored,
    block_hash,
    decode_event,
    decode_message,
)
from tests.agent.kvevents.kvstreams import (
    fixture_streams,
    message,
    recorded_frames,
    removed_array,
    removed_map,
    stored_array,
    stored_map,
)


def test_there_is_at_least_one_recorded_stream():
    assert fixture_streams(), "tests/fixtures/vllm/kv-events holds no *.events.jsonl"


@pytest.mark.parametrize("path", fixture_streams(), ids=lambda p: p.name)
def test_every_message_of_a_recorded_stream_decodes_in_sequence_without_skips(path):
    batches = [decode_message(f) for f in recorded_frames(path)]
    assert batches
    seqs = [b.seq for b in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "no gaps in a clean capture"
    assert all(b.skipped == 0 for b in batches)
    assert all(b.topic == b"kv-events" for b in batches)
    assert all(b.dp_rank == 0 for b in batches)
    kinds = {type(e) for b in batches for e in b.events}
    assert kinds <= {Stored, Removed, Cleared}
    for b in batches:
        for e in b.events:
            assert all(0 <= h < 1 << 64 for h in e.hashes) if not isinstance(e, Cleared) else True


def test_the_rotation_capture_has_the_counts_its_notes_give():
    path = next(p for p in fixture_streams() if "rotation" in p.name)
    events = [e for f in recorded_frames(path) for e in decode_message(f).events]
    stored = [e for e in events if isinstance(e, Stored)]
    removed = [e for e in events if isinstance(e, Removed)]
    assert len(recorded_frames(path)) == 17
    assert len(stored) == 17 and sum(len(e.hashes) for e in stored) == 115
    assert len(removed) == 115 and sum(len(e.hashes) for e in removed) == 115
    assert {e.medium for e in stored + removed} == {"GPU"}
    assert {e.block_size for e in stored} == {128}
    assert all(e.n_tokens == 128 * len(e.hashes) for e in stored)


def test_maps_and_positional_arrays_decode_to_the_same_events():
    maps = [stored_map([1, 2], None, medium="GPU"), removed_map([1], "GPU"), {"type": "AllBlocksCleared"}]
    arrays = [stored_array([1, 2], None, medium="GPU"), removed_array([1], "GPU"), ["AllBlocksCleared"]]
    a = decode_message(message(5, maps)).events
    b = decode_message(message(5, arrays)).events
    assert a == b
    assert a[0] == Stored(hashes=(1, 2), parent=None, block_size=16, medium="GPU", n_tokens=32)
    assert a[1] == Removed(hashes=(1,), medium="GPU")
    assert a[2] == Cleared()


def test_arrays_from_before_medium_existed_decode_with_no_medium():
    ev = decode_message(message(0, [stored_array([7], 3, medium=None), removed_array([7], medium=None)])).events
    assert ev == [
        Stored(hashes=(7,), parent=3, block_size=16, medium=None, n_tokens=16),
        Removed(hashes=(7,), medium=None),
    ]


def test_bytes_hashes_fold_to_the_same_int_vllm_publishes_by_default():
    digest = bytes(range(32))  # a sha256-sized hash
    as_int = int.from_bytes(digest, "big") & ((1 << 64) - 1)  # vLLM's maybe_convert_block_hash
    ev = decode_message(message(0, [stored_map([digest], None), removed_map([digest])])).events
    assert ev[0].hashes == (as_int,) and ev[1].hashes == (as_int,)
    assert block_hash(as_int) == as_int
    assert block_hash(True) is None and block_hash(b"") is None and block_hash("x") is None


def test_cpu_tier_placeholder_events_without_tokens_decode_with_their_medium():
    ph = stored_map([11, 12], 10, medium="CPU")
    ph["token_ids"] = []
    ev = decode_message(message(0, [ph, removed_map([11], "CPU")])).events
    assert ev[0] == Stored(hashes=(11, 12), parent=10, block_size=16, medium="CPU", n_tokens=0)
    assert ev[1] == Removed(hashes=(11,), medium="CPU")


def test_batch_without_a_rank_and_replay_end_marker():
    b = decode_message(message(3, [], rank=None))
    assert b.dp_rank is None and b.events == [] and not b.replay_end
    end = decode_message([b"", (-1).to_bytes(8, "big", signed=True), b""])
    assert end.replay_end


def test_unreadable_events_are_skipped_and_counted_the_rest_kept():
    events = [
        stored_map([1]),
        {"type": "Mystery", "block_hashes": [1]},
        {"type": "BlockStored", "block_hashes": ["nope"]},
        ["BlockStored"],
        42,
        None,
        removed_map([1]),
    ]
    b = decode_message(message(0, events))
    assert len(b.events) == 2 and b.skipped == 5


@pytest.mark.parametrize(
    "frames, reason",
    [
        ([b"kv", b"\x00" * 8], "3 frames"),
        ([b"kv", b"\x00" * 4, b"\x90"], "8"),
        ([b"kv", b"\x00" * 8, b"\xc1"], "not msgpack"),
        ([b"kv", b"\x00" * 8, msgpack.packb({"a": 1})], "event batch"),
        ([b"kv", b"\x00" * 8, msgpack.packb(["ts", []])], "event batch"),
        ([b"kv", b"\x00" * 8, msgpack.packb([1.0, "x"])], "event batch"),
    ],
)
def test_a_message_that_is_not_a_batch_is_refused_with_a_reason(frames, reason):
    with pytest.raises(BadMessage, match=reason):
        decode_message(frames)


def test_a_payload_over_the_size_limit_is_refused_before_parsing():
    with pytest.raises(BadMessage, match="limit"):
        decode_message([b"kv", b"\x00" * 8, b"\x00" * (MAX_PAYLOAD_BYTES + 1)])


def test_random_garbage_never_raises_anything_but_bad_message():
    rng = random.Random(17)
    good = message(1, [stored_map([1, 2, 3], 9), removed_map([4])])[2]
    for _ in range(3000):
        payload = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
        if rng.random() < 0.3:
            payload = payload[: rng.randrange(len(payload))]
        try:
            decode_message([b"kv", b"\x00" * 8, bytes(payload)])
        except BadMessage:
            pass


def test_decode_event_of_non_events_is_none():
    assert decode_event("BlockStored") is None
    assert decode_event([]) is None
    assert decode_event({"type": 3}) is None


def test_an_absurd_block_size_refuses_that_event_only():
    bad = {**stored_map([1]), "block_size": 2**40}
    b = decode_message(message(0, [bad, stored_map([2])]))
    assert b.skipped == 1 and [e.hashes for e in b.events] == [(2,)]


def test_group_idx_is_decoded_and_a_garbage_group_refuses_the_event():
    ev = {**stored_map([1]), "group_idx": 3}
    b = decode_message(message(0, [ev, {**removed_map([1]), "group_idx": 3}, {**stored_map([2]), "group_idx": -1}]))
    assert [e.group_idx for e in b.events] == [3, 3] and b.skipped == 1


def test_a_payload_over_the_cap_is_refused_before_it_is_unpacked():
    from agent.kvevents.decode import MAX_PAYLOAD_BYTES

    assert MAX_PAYLOAD_BYTES <= 8 * 1024 * 1024
    frames = message(0, [stored_map([1])])
    with pytest.raises(BadMessage, match="limit"):
        decode_message([frames[0], frames[1], b"\x00" * (MAX_PAYLOAD_BYTES + 1)])
