"""Decode vLLM's KV-event ZMQ messages, in every encoding vLLM has published.

A message is multipart ``[topic, seq, payload]``: seq 8 bytes big-endian (signed; the replay
socket ends its answer with seq -1 and an empty payload), payload msgpack ``[ts, events,
data_parallel_rank]`` (msgspec ``array_like``; the rank is omitted when None). Each event is:

- a map with a ``type`` tag (vLLM >= 0.24, e.g. 0.32.0):
  ``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": ..., "token_ids": [...],
  "block_size": 128, "lora_id": None, "medium": "GPU", ...}``;
- a positional array (vLLM <= 0.23): ``["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, ...]`` with trailing defaults omitted
  (``medium`` only since 0.10.2), ``["BlockRemoved", block_hashes, medium]``,
  ``["AllBlocksCleared"]``.

Block hashes are ints (the low 64 bits, vLLM's default) or bytes (with
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``); bytes are folded to the same low 64 bits, so both
forms name a block the same way. Anything malformed is refused with a reason (whole message) or
skipped and counted (one event); nothing here raises anything but :class:`BadMessage`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

_MASK64 = (1 << 64) - 1
# A batch bigger than this is refused before it is parsed (the subscriber also sets ZMQ_MAXMSGSIZE
# so such a frame never reaches memory). vLLM publishes one batch per engine step: even an
# 8,192-token prefill with its token ids is ~60 KiB, so 4 MiB is ample headroom.
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
MAX_BLOCK_SIZE = 1 << 20  # tokens per block; vLLM's largest (hybrid models' aligned blocks) are ~1e3
MAX_GROUP_IDX = 1024
REPLAY_END_SEQ = -1


class BadMessage(ValueError):
    """A message that is not a KV-event batch (counted and skipped by the subscriber)."""


@dataclass(slots=True, frozen=True)
class Stored:
    """Blocks that entered a cache (``medium`` GPU: computed or reloaded into the prefix cache)."""

    hashes: tuple[int, ...]
    parent: int | None
    block_size: int | None
    medium: str | None
    n_tokens: int  # len(token_ids); 0 for placeholder events (offload tiers without tokens)
    group_idx: int = 0  # the KV-cache group (hybrid models publish one event per group)


@dataclass(slots=True, frozen=True)
class Removed:
    hashes: tuple[int, ...]
    medium: str | None
    group_idx: int = 0


@dataclass(slots=True, frozen=True)
class Cleared:
    """AllBlocksCleared: the prefix cache was reset (a new epoch for reuse distances)."""


Event = Stored | Removed | Cleared


@dataclass(slots=True)
class Batch:
    topic: bytes
    seq: int
    ts: float
    dp_rank: int | None
    events: list[Event] = field(default_factory=list)
    skipped: int = 0  # events in the batch that could not be read

    @property
    def replay_end(self) -> bool:
        return self.seq == REPLAY_END_SEQ


def block_hash(value: Any) -> int | None:
    """One block hash as a 64-bit int (vLLM's own int form), or None when it is not a hash."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value & _MASK64
    if isinstance(value, bytes | bytearray) and value:
        return int.from_bytes(value, "big") & _MASK64
    return None


def _hashes(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list | tuple):
        return None
    out = []
    for v in value:
        h = block_hash(v)
        if h is None:
            return None
        out.append(h)
    return tuple(out)


def _opt_str(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _group(value: Any) -> int | None:
    """``group_idx`` (absent before 0.2x: group 0); None when it is not a sane group number."""
    if value is None:
        return 0
    g = _opt_int(value)
    return g if g is not None and 0 <= g <= MAX_GROUP_IDX else None


def _stored(
    hashes: Any, parent: Any, token_ids: Any, block_size: Any, medium: Any, group_idx: Any = None
) -> Stored | None:
    hs = _hashes(hashes)
    group = _group(group_idx)
    if hs is None or group is None:
        return None
    bs = _opt_int(block_size)
    if block_size is not None and (bs is None or not 0 <= bs <= MAX_BLOCK_SIZE):
        return None  # e.g. 2**40: refuse this event only, not the batch or the window
    return Stored(
        hashes=hs,
        parent=block_hash(parent) if parent is not None else None,
        block_size=bs,
        medium=_opt_str(medium),
        n_tokens=len(token_ids) if isinstance(token_ids, list | tuple) else 0,
        group_idx=group,
    )


def _removed(hashes: Any, medium: Any, group_idx: Any = None) -> Removed | None:
    hs = _hashes(hashes)
    group = _group(group_idx)
    return None if hs is None or group is None else Removed(hashes=hs, medium=_opt_str(medium), group_idx=group)


def decode_event(raw: Any) -> Event | None:
    """One event in either encoding, or None when it is not one we can read."""
    if isinstance(raw, dict):
        kind = _opt_str(raw.get("type"))
        if kind == "BlockStored":
            return _stored(
                raw.get("block_hashes"),
                raw.get("parent_block_hash"),
                raw.get("token_ids"),
                raw.get("block_size"),
                raw.get("medium"),
                raw.get("group_idx"),
            )
        if kind == "BlockRemoved":
            return _removed(raw.get("block_hashes"), raw.get("medium"), raw.get("group_idx"))
        if kind == "AllBlocksCleared":
            return Cleared()
        return None
    if isinstance(raw, list | tuple) and raw:
        kind = _opt_str(raw[0])
        rest = list(raw[1:])
        if kind == "BlockStored" and len(rest) >= 4:
            rest += [None] * (6 - len(rest))
            return _stored(rest[0], rest[1], rest[2], rest[3], rest[5])
        if kind == "BlockRemoved" and len(rest) >= 1:
            return _removed(rest[0], rest[1] if len(rest) > 1 else None)
        if kind == "AllBlocksCleared":
            return Cleared()
    return None


def decode_payload(payload: bytes) -> tuple[float, list[Event], int | None, int]:
    """``(ts, events, dp_rank, skipped)`` of one msgpack payload."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise BadMessage(f"payload of {len(payload)} bytes is over the {MAX_PAYLOAD_BYTES}-byte limit")
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise BadMessage(f"payload is not msgpack: {type(exc).__name__}") from None
    if not isinstance(body, list) or len(body) < 2:
        raise BadMessage("payload is not an event batch [ts, events, dp_rank]")
    ts, raw_events = body[0], body[1]
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not isinstance(raw_events, list):
        raise BadMessage("payload is not an event batch [ts, events, dp_rank]")
    rank = _opt_int(body[2]) if len(body) > 2 else None
    events: list[Event] = []
    skipped = 0
    for raw in raw_events:
        ev = decode_event(raw)
        if ev is None:
            skipped += 1
        else:
            events.append(ev)
    return float(ts), events, rank, skipped


def decode_message(frames: Sequence[bytes]) -> Batch:
    """One multipart message ``[topic, seq, payload]`` (a replay reply minus its routing frames)."""
    if len(frames) != 3:
        raise BadMessage(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    topic, seq_b, payload = (bytes(f) for f in frames)
    if len(seq_b) != 8:
        raise BadMessage(f"sequence frame of {len(seq_b)} bytes, expected 8")
    seq = int.from_bytes(seq_b, "big", signed=True)
    if seq == REPLAY_END_SEQ:
        return Batch(topic=topic, seq=seq, ts=0.0, dp_rank=None)
    ts, events, rank, skipped = decode_payload(payload)
    return Batch(topic=topic, seq=seq, ts=ts, dp_rank=rank, events=events, skipped=skipped)
